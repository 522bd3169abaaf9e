// SentencePiece tokenizers: a loaded model (encode, decode, special ids) and training a new one
// from plain-text / JSONL documents. The SentencePiece headers stay out of this one.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/text_input.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace llmt {

class Tokenizer {
 public:
  // Throws Error naming the file when it is missing or not a SentencePiece model.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Thread-safe (SentencePiece's encode and decode are const).
  std::vector<int32_t> encode(std::string_view text) const;
  void encode(std::string_view text, std::vector<int32_t>& ids) const;  // reuses ids' capacity
  std::string decode(std::span<const int32_t> ids) const;

  const std::string& path() const { return path_; }
  int64_t vocab_size() const;
  int32_t bos_id() const;  // -1 when the model has none
  int32_t eos_id() const;  // -1 when the model has none; the end-of-document token of prepare
  int32_t unk_id() const;
  std::string piece(int32_t id) const;  // the id's piece, e.g. "</s>"

 private:
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

// The files with which Hugging Face's AutoTokenizer.from_pretrained(DIR) loads this tokenizer and
// encodes text to the ids llmtrain does (docs/checkpoint-format.md): tokenizer.model (the
// SentencePiece model, copied), tokenizer_config.json (LlamaTokenizer, which wraps SentencePiece;
// no BOS or EOS added, as `data prepare` adds none before a document; legacy mode, which encodes
// with SentencePiece as it is) and special_tokens_map.json. As (name, contents).
std::vector<std::pair<std::string, std::string>> hf_tokenizer_files(const Tokenizer& tok);
// Why AutoTokenizer would encode some text differently from `tok`, or "" when it encodes alike:
// LlamaTokenizer does not normalize text and falls back to bytes, so a model that normalizes
// (SentencePiece's default NFKC, folded whitespace) or has no byte pieces differs. Found by a probe
// text (double spaces, a newline, a tab, an NFKC-folded ligature, a character outside the
// vocabulary) that must decode to itself.
std::string hf_tokenizer_mismatch(const Tokenizer& tok);

enum class TokenizerModel { bpe, unigram };

struct TokenizerTrainOptions {
  int64_t vocab_size = 0;
  TokenizerModel model = TokenizerModel::bpe;
  double character_coverage = 0.9995;  // share of characters the vocabulary must cover
  int64_t max_sentences = 2'000'000;   // lines sampled for training when the input has more
  int threads = 0;                     // 0 = all cores
  TextInputOptions input;              // json_key for JSONL inputs
  bool verbose = false;                // SentencePiece's own training log on stderr
  // Bytes of characters outside the vocabulary as <0xNN> pieces (Llama's byte fallback), so every
  // text round-trips; -1 = on when vocab_size >= kByteFallbackMinVocab (256 byte pieces need room).
  int byte_fallback = -1;
};
inline constexpr int64_t kByteFallbackMinVocab = 512;

// Trains on the non-blank lines of the documents of `inputs` (SentencePiece's unit is a line) and
// writes the model to `output` (through `output`.tmp, renamed when complete). unk = 0, bos = 1,
// eos = 2. Text is not normalized (identity, whitespace kept: Llama's settings), so with byte
// fallback a document decodes to itself and Hugging Face's LlamaTokenizer encodes it the same. Throws Error with SentencePiece's message when training fails (e.g. a vocabulary too
// large for the text).
void train_tokenizer(const std::vector<std::string>& inputs, const std::string& output,
                     const TokenizerTrainOptions& opts);

}  // namespace llmt
