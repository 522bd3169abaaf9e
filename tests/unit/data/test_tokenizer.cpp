// The SentencePiece wrapper: train (bpe, unigram; text and JSONL inputs) -> encode -> decode
// gives the text back; the special ids; load and training errors name the file and the cause.
#include <gtest/gtest.h>

#include <fstream>

#include "core/check.h"
#include "data/tokenizer.h"
#include "tests/unit/data/dataset_files.h"
#include "tests/unit/data/tiny_corpus.h"

namespace llmt {
namespace {

using TokenizerTest = test::DatasetFiles;

TEST_F(TokenizerTest, BpeRoundTrip) {
  Tokenizer tok(test::tiny_tokenizer_path());
  EXPECT_EQ(tok.vocab_size(), 200);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  // Sentences the model was not trained on, from the same words.
  for (const std::string& s : test::tiny_sentences(50, 99)) {
    const std::vector<int32_t> ids = tok.encode(s);
    ASSERT_FALSE(ids.empty());
    for (int32_t id : ids) {
      EXPECT_GE(id, 3) << "no unk/bos/eos inside text made of known characters";
      EXPECT_LT(id, 200);
    }
    EXPECT_LT(ids.size(), s.size() / 2) << "merges learned: fewer tokens than half the bytes";
    EXPECT_EQ(tok.decode(ids), s);
  }
  EXPECT_TRUE(tok.encode("").empty());
}

TEST_F(TokenizerTest, UnigramFromJsonlRoundTrip) {
  std::ofstream out(dir_ / "corpus.jsonl");
  for (const std::string& s : test::tiny_sentences(1000))
    out << "{\"id\": 1, \"body\": \"" << s << "\"}\n";
  out.close();
  TokenizerTrainOptions opts;
  opts.vocab_size = 60;
  opts.model = TokenizerModel::unigram;
  opts.input.json_key = "body";
  const std::string model = (dir_ / "uni.model").string();
  train_tokenizer({(dir_ / "corpus.jsonl").string()}, model, opts);
  EXPECT_FALSE(std::filesystem::exists(model + ".tmp"));
  Tokenizer tok(model);
  EXPECT_EQ(tok.vocab_size(), 60);
  for (const std::string& s : test::tiny_sentences(20, 5)) EXPECT_EQ(tok.decode(tok.encode(s)), s);
}

TEST_F(TokenizerTest, MissingModel) {
  const std::string path = (dir_ / "none.model").string();
  try {
    Tokenizer tok(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ": no such tokenizer model (train one with `llmtrain data tokenizer-train`)");
  }
}

TEST_F(TokenizerTest, NotAModel) {
  const std::string path = (dir_ / "garbage.model").string();
  std::ofstream(path) << "this is not a protobuf";
  try {
    Tokenizer tok(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(std::string(e.what()).starts_with(path + ": not a SentencePiece model: "))
        << e.what();
  }
}

TEST_F(TokenizerTest, MalformedJsonlInputStopsTraining) {
  std::ofstream(dir_ / "bad.jsonl") << "{\"text\": \"fine\"}\n{\"body\": \"no text\"}\n";
  TokenizerTrainOptions opts;
  opts.vocab_size = 50;
  const std::string path = (dir_ / "bad.jsonl").string();
  try {
    train_tokenizer({path}, (dir_ / "t.model").string(), opts);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ":2: no \"text\" field (fields: body); choose one with --json-key");
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ / "t.model"));
}

TEST_F(TokenizerTest, VocabularyTooLargeForTheText) {
  test::write_lines(dir_ / "small.txt", {"tiny text", "only a few words"});
  TokenizerTrainOptions opts;
  opts.vocab_size = 5000;
  const std::string model = (dir_ / "t.model").string();
  try {
    train_tokenizer({(dir_ / "small.txt").string()}, model, opts);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.starts_with(model + ": tokenizer training failed: ")) << msg;
    EXPECT_NE(msg.find("Vocabulary size too high (5000)"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace llmt
