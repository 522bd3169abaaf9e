// The SentencePiece wrapper: RAII over SentencePieceProcessor, and training through
// SentencePieceTrainer with a sentence iterator over our document readers (no temp text file).
#include "data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include "config/json.h"
#include "core/check.h"

namespace llmt {

static_assert(std::is_same_v<int, int32_t>, "SentencePiece ids are int");

Tokenizer::Tokenizer(const std::string& model_path)
    : path_(model_path), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  if (!std::filesystem::is_regular_file(model_path))
    throw Error(detail::concat(model_path,
                               ": no such tokenizer model (train one with `llmtrain "
                               "data tokenizer-train`)"));
  const auto status = sp_->Load(model_path);
  if (!status.ok())
    throw Error(detail::concat(model_path, ": not a SentencePiece model: ", status.ToString()));
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  encode(text, ids);
  return ids;
}

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& ids) const {
  const auto status = sp_->Encode(text, &ids);
  if (!status.ok()) throw Error(detail::concat(path_, ": encode failed: ", status.ToString()));
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  if (!status.ok()) throw Error(detail::concat(path_, ": decode failed: ", status.ToString()));
  return text;
}

int64_t Tokenizer::vocab_size() const {
  return sp_->GetPieceSize();
}
int32_t Tokenizer::bos_id() const {
  return sp_->bos_id();
}
int32_t Tokenizer::eos_id() const {
  return sp_->eos_id();
}
int32_t Tokenizer::unk_id() const {
  return sp_->unk_id();
}
std::string Tokenizer::piece(int32_t id) const {
  return sp_->IdToPiece(id);
}

std::string hf_tokenizer_mismatch(const Tokenizer& tok) {
  // Two spaces, a newline, a tab, U+FB01 (NFKC: "fi") and U+4E2D (outside a small vocabulary).
  const std::string probe = "a  b\nc\td \xef\xac\x81 \xe4\xb8\xad";
  const std::string back = tok.decode(tok.encode(probe));
  if (back == probe) return "";
  const bool bytes = tok.encode("\n").size() == 1 && tok.piece(tok.encode("\n")[0]) == "<0x0A>";
  return detail::concat(tok.path(), " does not encode text as it is (\"", probe, "\" decodes to \"",
                        back, "\"): it normalizes text", bytes ? "" : " or has no byte pieces",
                        ", which Hugging Face's LlamaTokenizer does not; retrain it with this "
                        "llmtrain's `data tokenizer-train` (identity normalization, byte "
                        "fallback at vocab_size >= ",
                        kByteFallbackMinVocab, ")");
}

std::vector<std::pair<std::string, std::string>> hf_tokenizer_files(const Tokenizer& tok) {
  std::ifstream in(tok.path(), std::ios::binary);
  const std::string model((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLMT_CHECK(in.good() || in.eof(), tok.path(), ": cannot read the tokenizer model");
  auto special = [&](const char* key, int32_t id) {
    return detail::concat("  \"", key, "\": ", id >= 0 ? json_string(tok.piece(id)) : "null");
  };
  const std::string specials =
      detail::concat(special("bos_token", tok.bos_id()), ",\n", special("eos_token", tok.eos_id()),
                     ",\n", special("unk_token", tok.unk_id()));
  const std::string config =
      detail::concat("{\n  \"tokenizer_class\": \"LlamaTokenizer\",\n  \"add_bos_token\": false,\n",
                     "  \"add_eos_token\": false,\n  \"legacy\": true,\n",
                     "  \"clean_up_tokenization_spaces\": false,\n  \"pad_token\": null,\n",
                     "  \"sp_model_kwargs\": {},\n", specials, "\n}\n");
  return {{"tokenizer.model", model},
          {"tokenizer_config.json", config},
          {"special_tokens_map.json", "{\n" + specials + "\n}\n"}};
}

namespace {

// The non-blank lines of every document of every input, in order. An exception from a reader
// (a malformed JSONL line) ends the iteration and is rethrown once training returns.
class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  LineIterator(const std::vector<std::string>& inputs, const TextInputOptions& opts)
      : inputs_(inputs), opts_(opts) {
    Next();
  }
  bool done() const override { return done_; }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override {
    if (!error_) return {};
    return {sentencepiece::util::StatusCode::kInternal, "reading the input failed"};
  }
  void Next() override {
    try {
      while (!done_) {
        if (next_line()) return;
        if (!reader_ || !reader_->next(doc_)) {
          if (file_ == inputs_.size()) {
            done_ = true;
            return;
          }
          reader_ = std::make_unique<DocumentReader>(inputs_[file_++], opts_);
          continue;
        }
        pos_ = 0;
      }
    } catch (...) {
      error_ = std::current_exception();
      done_ = true;
    }
  }
  std::exception_ptr error() const { return error_; }

 private:
  // The next non-blank line of doc_ into value_.
  bool next_line() {
    while (pos_ < doc_.size()) {
      size_t end = doc_.find('\n', pos_);
      if (end == std::string::npos) end = doc_.size();
      value_.assign(doc_, pos_, end - pos_);
      pos_ = end + 1;
      if (value_.find_first_not_of(" \t\r\f\v") != std::string::npos) return true;
    }
    return false;
  }

  const std::vector<std::string>& inputs_;
  TextInputOptions opts_;
  size_t file_ = 0;
  std::unique_ptr<DocumentReader> reader_;
  std::string doc_, value_;
  size_t pos_ = 0;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace

void train_tokenizer(const std::vector<std::string>& inputs, const std::string& output,
                     const TokenizerTrainOptions& opts) {
  LLMT_CHECK(opts.vocab_size > 0, "vocab_size=", opts.vocab_size);
  const int threads =
      opts.threads > 0 ? opts.threads : static_cast<int>(std::thread::hardware_concurrency());
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", opts.model == TokenizerModel::bpe ? "bpe" : "unigram"},
      {"vocab_size", std::to_string(opts.vocab_size)},
      {"character_coverage", std::to_string(opts.character_coverage)},
      {"input_sentence_size", std::to_string(opts.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(std::max(threads, 1))},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"minloglevel", opts.verbose ? "0" : "1"},  // 0 info, 1 warnings and errors only
      // Llama's text handling: no normalization, whitespace kept, digits split, bytes for what
      // the vocabulary lacks (docs/data.md).
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"byte_fallback",
       (opts.byte_fallback < 0 ? opts.vocab_size >= kByteFallbackMinVocab : opts.byte_fallback != 0)
           ? "true"
           : "false"},
  };
  LineIterator lines(inputs, opts.input);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
  if (lines.error()) std::rethrow_exception(lines.error());
  if (!status.ok())
    throw Error(detail::concat(output, ": tokenizer training failed: ", status.ToString()));

  const std::string tmp = output + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(model.data(), static_cast<std::streamsize>(model.size()));
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      throw Error(detail::concat(tmp, ": cannot write the model"));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, output, ec);
  if (ec) throw Error(detail::concat(output, ": cannot move the model into place: ", ec.message()));
}

}  // namespace llmt
