// `llmtrain data tokenizer-train|prepare|inspect`: train a SentencePiece model, turn text/JSONL
// into a Megatron indexed dataset, and describe/verify one. Flags and printing only; the work is
// in data/ (tokenizer.h, prepare.h, indexed_dataset.h).
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "app/commands.h"
#include "core/check.h"
#include "data/indexed_dataset.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "train/metrics.h"

namespace llmt::app {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// "12.3 MB" (decimal units, as MB/s is).
std::string format_bytes(double b) {
  char buf[32];
  if (b >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6)
    std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  else if (b >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

// "[#########-----------]  45% | 1234 docs | 567890 tokens | 8.1 MB/s | eta 12s", on one
// rewritten line when stderr is a terminal, else one line per update.
void draw_progress(const PrepareStats& s, bool tty, bool done) {
  const double frac = s.bytes_total > 0 ? static_cast<double>(s.bytes_read) / s.bytes_total : 1;
  const int width = 24, filled = static_cast<int>(frac * width + 0.5);
  const double rate = s.seconds > 0 ? s.bytes_read / s.seconds : 0;
  const double eta = rate > 0 ? (s.bytes_total - s.bytes_read) / rate : -1;
  std::fprintf(stderr, "%s[%s%s] %3.0f%% | %lld docs | %lld tokens | %.1f MB/s | %s %s%s",
               tty ? "\r" : "", std::string(filled, '#').c_str(),
               std::string(width - filled, '-').c_str(), 100 * frac,
               static_cast<long long>(s.documents), static_cast<long long>(s.tokens), rate / 1e6,
               done ? "took" : "eta", format_duration(done ? s.seconds : eta).c_str(),
               tty && !done ? "\x1b[K" : "\n");
}

void run_tokenizer_train(const std::vector<std::string>& inputs, const std::string& output,
                         const TokenizerTrainOptions& opts) {
  const auto start = std::chrono::steady_clock::now();
  train_tokenizer(inputs, output, opts);
  Tokenizer tok(output);
  std::printf("wrote %s: %s, %lld pieces (bos %d, eos %d) in %s\n", output.c_str(),
              opts.model == TokenizerModel::bpe ? "bpe" : "unigram",
              static_cast<long long>(tok.vocab_size()), tok.bos_id(), tok.eos_id(),
              format_duration(seconds_since(start)).c_str());
}

void run_prepare(const std::vector<std::string>& inputs, const std::string& tokenizer,
                 const std::string& output, PrepareOptions opts, bool force_progress) {
  for (const char* ext : {".bin", ".idx"}) {
    if (output.size() > 4 && output.ends_with(ext))
      throw ConfigError(detail::concat("--output ", output, " is a prefix: ", ext,
                                       " is added (write --output ",
                                       output.substr(0, output.size() - 4), ")"));
  }
  Tokenizer tok(tokenizer);
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  if (tty || force_progress) {
    auto last = std::chrono::steady_clock::now() - std::chrono::seconds(1);
    opts.progress = [tty, last](const PrepareStats& s) mutable {
      if (seconds_since(last) < (tty ? 0.2 : 2.0) || s.bytes_read >= s.bytes_total) return;
      last = std::chrono::steady_clock::now();
      draw_progress(s, tty, false);
    };
  }
  PrepareStats s = prepare(inputs, tok, output, opts);
  if (opts.progress) draw_progress(s, tty, true);
  std::printf(
      "wrote %s.bin + %s.idx: %lld documents (%lld empty ones skipped), %lld tokens (%s), from %s "
      "of text in %.2f s: %.0f tokens/s, %.2f MB/s\n",
      output.c_str(), output.c_str(), static_cast<long long>(s.documents),
      static_cast<long long>(s.empty_documents), static_cast<long long>(s.tokens),
      token_dtype_name(s.dtype), format_bytes(s.bytes_read).c_str(), s.seconds,
      s.seconds > 0 ? s.tokens / s.seconds : 0, s.seconds > 0 ? s.bytes_read / s.seconds / 1e6 : 0);
}

// A power-of-two histogram of document lengths in tokens: bins {0}, [1,2), [2,4), [4,8), ...
void print_length_histogram(const IndexedDataset& ds) {
  const int64_t D = ds.num_documents();
  std::vector<int64_t> lengths(D);
  for (int64_t d = 0; d < D; ++d) {
    int64_t n = 0;
    for (int64_t s = ds.document_start(d); s < ds.document_start(d + 1); ++s)
      n += ds.sequence_length(s);
    lengths[d] = n;
  }
  if (D == 0) return;
  std::map<int, int64_t> bins;  // bin -> count; bin 0 holds length 0, bin k [2^(k-1), 2^k)
  for (int64_t n : lengths) bins[std::bit_width(static_cast<uint64_t>(n))]++;
  std::sort(lengths.begin(), lengths.end());
  std::printf("document length (tokens): min %lld, median %lld, mean %.1f, max %lld\n",
              static_cast<long long>(lengths.front()), static_cast<long long>(lengths[D / 2]),
              static_cast<double>(ds.num_tokens()) / D, static_cast<long long>(lengths.back()));
  int64_t most = 0;
  for (auto& [bin, count] : bins) most = std::max(most, count);
  for (int b = bins.begin()->first; b <= bins.rbegin()->first; ++b) {
    const int64_t count = bins.count(b) ? bins[b] : 0;
    const long long lo = b == 0 ? 0 : 1LL << (b - 1), hi = b == 0 ? 0 : (1LL << b) - 1;
    const int bar = static_cast<int>((40 * count + most - 1) / most);
    std::printf("  %8lld - %-8lld %10lld  %s\n", lo, hi, static_cast<long long>(count),
                std::string(bar, '#').c_str());
  }
}

void run_inspect(const std::string& prefix, const std::string& tokenizer, bool verify,
                 int64_t vocab_size, int64_t show) {
  if (verify && tokenizer.empty() && vocab_size == 0)
    throw ConfigError(
        "--verify checks token ids against a vocabulary: give --tokenizer or "
        "--vocab-size");
  std::unique_ptr<Tokenizer> tok;
  if (!tokenizer.empty()) tok = std::make_unique<Tokenizer>(tokenizer);
  auto ds = IndexedDataset::open(prefix);
  std::printf("dataset %s (%s.bin %s, %s.idx %s)\n", prefix.c_str(), prefix.c_str(),
              format_bytes(std::filesystem::file_size(prefix + ".bin")).c_str(), prefix.c_str(),
              format_bytes(std::filesystem::file_size(prefix + ".idx")).c_str());
  std::printf("dtype %s (%lld bytes per token)\n", token_dtype_name(ds->dtype()),
              static_cast<long long>(token_dtype_size(ds->dtype())));
  std::printf(
      "documents %lld\nsequences %lld\ntokens %lld\n", static_cast<long long>(ds->num_documents()),
      static_cast<long long>(ds->num_sequences()), static_cast<long long>(ds->num_tokens()));
  print_length_histogram(*ds);

  if (verify) {
    const int64_t V = vocab_size > 0 ? vocab_size : tok->vocab_size();
    const auto start = std::chrono::steady_clock::now();
    ds->verify_tokens(V);
    std::printf("verify: ok, all %lld token ids in [0, %lld) (%s) in %.2f s\n",
                static_cast<long long>(ds->num_tokens()), static_cast<long long>(V),
                vocab_size > 0 ? "--vocab-size" : tokenizer.c_str(), seconds_since(start));
  }

  // The first `show` documents (all their sequences): decoded text (at most 400 bytes) with a
  // tokenizer, else the ids (at most 64).
  for (int64_t d = 0; d < std::min(show, ds->num_documents()); ++d) {
    std::vector<int32_t> ids;
    for (int64_t s = ds->document_start(d); s < ds->document_start(d + 1); ++s) {
      const int64_t n = ds->sequence_length(s);
      ids.resize(ids.size() + n);
      ds->read(s, 0, n, ids.data() + ids.size() - n);
    }
    const int64_t len = static_cast<int64_t>(ids.size());
    std::printf("--- document %lld (%lld tokens)\n", static_cast<long long>(d),
                static_cast<long long>(len));
    if (tok) {
      std::string text = tok->decode(ids);
      if (text.size() > 400) {
        size_t cut = 400;
        while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
        text = text.substr(0, cut) + " [...]";
      }
      std::printf("%s\n", text.c_str());
    } else {
      std::string line;
      for (int64_t k = 0; k < std::min<int64_t>(len, 64); ++k)
        line += detail::concat(k ? " " : "", ids[k]);
      std::printf("%s%s\n", line.c_str(), len > 64 ? " ..." : "");
    }
  }
}

}  // namespace

Run add_data_command(CLI::App& app) {
  struct Args {
    std::vector<std::string> inputs;
    std::string output, tokenizer, prefix, model_type = "bpe", byte_fallback = "auto";
    TokenizerTrainOptions train;
    PrepareOptions prepare;
    bool progress = false, verify = false;
    int64_t vocab_size = 0, show = 3;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("data", "Tokenizers and token datasets (docs/data.md)");
  cmd->require_subcommand(1);

  CLI::App* train = cmd->add_subcommand("tokenizer-train", "Train a SentencePiece tokenizer");
  train->add_option("--input", a->inputs, "Text or JSONL (.jsonl/.json) files")
      ->required()
      ->check(CLI::ExistingFile);
  train->add_option("--vocab-size", a->train.vocab_size, "Number of pieces")
      ->required()
      ->check(CLI::PositiveNumber);
  train->add_option("--model-type", a->model_type, "bpe or unigram")
      ->check(CLI::IsMember({"bpe", "unigram"}))
      ->capture_default_str();
  train->add_option("--output", a->output, "The model file to write (e.g. tok.model)")->required();
  train->add_option("--json-key", a->train.input.json_key, "JSONL field holding the text")
      ->capture_default_str();
  train
      ->add_option("--character-coverage", a->train.character_coverage,
                   "Share of characters the vocabulary must cover")
      ->check(CLI::Range(0.5, 1.0))
      ->capture_default_str();
  train
      ->add_option("--max-sentences", a->train.max_sentences,
                   "Lines sampled for training when the input has more")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  train->add_option("--threads", a->train.threads, "Threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  train->add_flag("-v,--verbose", a->train.verbose, "Show SentencePiece's training log");
  train
      ->add_option("--byte-fallback", a->byte_fallback,
                   "<0xNN> byte pieces for characters outside the vocabulary (exact round trip); "
                   "auto: on at --vocab-size >= 512")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();

  CLI::App* prep =
      cmd->add_subcommand("prepare", "Tokenize text/JSONL into PREFIX.bin + PREFIX.idx");
  prep->add_option("--input", a->inputs, "Text or JSONL (.jsonl/.json) files")
      ->required()
      ->check(CLI::ExistingFile);
  prep->add_option("--tokenizer", a->tokenizer, "SentencePiece model")
      ->required()
      ->check(CLI::ExistingFile);
  prep->add_option("--output", a->output, "Dataset prefix (writes PREFIX.bin and PREFIX.idx)")
      ->required();
  prep->add_flag("--append-eod", a->prepare.append_eod, "Append the eos token to every document");
  prep->add_flag("--line-docs", a->prepare.input.line_docs,
                 "Text: one document per line (default: per blank-line-separated block)");
  prep->add_option("--json-key", a->prepare.input.json_key, "JSONL field holding the text")
      ->capture_default_str();
  prep->add_option("--threads", a->prepare.threads, "Tokenizer threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  prep->add_flag("--progress", a->progress, "Progress lines even when stderr is not a terminal");

  CLI::App* insp = cmd->add_subcommand("inspect", "Describe (and verify) an indexed dataset");
  insp->add_option("prefix", a->prefix, "Dataset prefix (PREFIX.bin + PREFIX.idx)")->required();
  insp->add_option("--tokenizer", a->tokenizer, "Decode with this SentencePiece model")
      ->check(CLI::ExistingFile);
  insp->add_flag("--verify", a->verify,
                 "Read every token and check 0 <= id < vocabulary size (--vocab-size, else the "
                 "tokenizer's)");
  insp->add_option("--vocab-size", a->vocab_size, "Vocabulary size for --verify")
      ->check(CLI::PositiveNumber);
  insp->add_option("--show", a->show, "Print the first N documents (decoded with --tokenizer)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();

  return [a, train, prep]() {
    if (train->parsed()) {
      a->train.model = a->model_type == "bpe" ? TokenizerModel::bpe : TokenizerModel::unigram;
      a->train.byte_fallback = a->byte_fallback == "auto" ? -1 : a->byte_fallback == "on" ? 1 : 0;
      run_tokenizer_train(a->inputs, a->output, a->train);
    } else if (prep->parsed()) {
      run_prepare(a->inputs, a->tokenizer, a->output, a->prepare, a->progress);
    } else {
      run_inspect(a->prefix, a->tokenizer, a->verify, a->vocab_size, a->show);
    }
    return 0;
  };
}

}  // namespace llmt::app
