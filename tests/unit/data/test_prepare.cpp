// `data prepare`: plain text (blocks and --line-docs) and JSONL in, and every document of the
// dataset is exactly the tokenizer's ids for that document (+ eod), whatever the chunking and
// thread count. Also the JSONL field scanner and its errors.
#include <gtest/gtest.h>

#include <fstream>

#include "core/check.h"
#include "data/indexed_dataset.h"
#include "data/prepare.h"
#include "tests/unit/data/dataset_files.h"
#include "tests/unit/data/tiny_corpus.h"

namespace llmt {
namespace {

class PrepareTest : public test::DatasetFiles {
 protected:
  void SetUp() override {
    DatasetFiles::SetUp();
    tok_ = std::make_unique<Tokenizer>(test::tiny_tokenizer_path());
  }

  // Prepares `inputs` and checks document i == encode(expected[i]) (+ eos).
  PrepareStats expect_documents(const std::vector<std::string>& inputs,
                                const std::vector<std::string>& expected, PrepareOptions opts) {
    const std::string prefix = (dir_ / "out").string();
    PrepareStats stats = prepare(inputs, *tok_, prefix, opts);
    auto ds = IndexedDataset::open(prefix);
    EXPECT_EQ(ds->dtype(), TokenDType::u16);
    EXPECT_EQ(ds->num_documents(), static_cast<int64_t>(expected.size()));
    EXPECT_EQ(stats.documents, static_cast<int64_t>(expected.size()));
    EXPECT_EQ(stats.tokens, ds->num_tokens());
    for (size_t i = 0; i < expected.size() && i < static_cast<size_t>(ds->num_sequences()); ++i) {
      std::vector<int32_t> want = tok_->encode(expected[i]);
      if (opts.append_eod) want.push_back(tok_->eos_id());
      std::vector<int32_t> got(ds->sequence_length(i));
      ds->read(i, 0, static_cast<int64_t>(got.size()), got.data());
      EXPECT_EQ(got, want) << "document " << i << ": " << expected[i];
    }
    return stats;
  }

  std::string write_file(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return (dir_ / name).string();
  }

  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(PrepareTest, TextBlocksWithEod) {
  const std::string path =
      write_file("a.txt",
                 "\n\nthe model learns.\nfrom text\n\n\n\nevery token is one piece.\r\n  \t\n"
                 "the quick brown fox\r\njumps over\n\nlazy dog");
  PrepareOptions opts;
  opts.append_eod = true;
  PrepareStats s = expect_documents({path},
                                    {"the model learns.\nfrom text", "every token is one piece.",
                                     "the quick brown fox\njumps over", "lazy dog"},
                                    opts);
  EXPECT_EQ(s.bytes_read, s.bytes_total);
  EXPECT_EQ(s.empty_documents, 0);
}

TEST_F(PrepareTest, LineDocsWithoutEod) {
  const std::string path = write_file("a.txt", "one piece of text\n\ndata flows\nthrough layers\n");
  PrepareOptions opts;
  opts.input.line_docs = true;
  expect_documents({path}, {"one piece of text", "data flows", "through layers"}, opts);
}

TEST_F(PrepareTest, JsonlWithEscapesOtherFieldsAndEmptyDocuments) {
  const std::string path = write_file("a.jsonl",
                                      "{\"meta\": {\"text\": \"nested, not this\", \"n\": [1, "
                                      "2.5e3, {}]}, \"text\": \"the dog\\n\\tis "
                                      "\\\"lazy\\\" caf\\u00e9 \\ud83d\\ude00\"}\n"
                                      "\n"
                                      "{\"text\": \"\", \"id\": null}\n"
                                      "  {\"id\": true, \"text\": \"rivers run to the sea\"}  \n");
  PrepareOptions opts;
  opts.append_eod = true;
  PrepareStats s = expect_documents(
      {path}, {"the dog\n\tis \"lazy\" caf\xc3\xa9 \xf0\x9f\x98\x80", "rivers run to the sea"},
      opts);
  EXPECT_EQ(s.empty_documents, 1);
}

TEST_F(PrepareTest, CustomJsonKeyAndSeveralInputsInOrder) {
  const std::string a = write_file("a.json", "{\"content\": \"stars\"}\n{\"content\": \"sea\"}\n");
  const std::string b = write_file("b.txt", "bright stars\n\nslowly");
  PrepareOptions opts;
  opts.input.json_key = "content";
  expect_documents({a, b}, {"stars", "sea", "bright stars", "slowly"}, opts);
}

// Many small chunks on 2 threads give the same dataset as one chunk on one thread; the progress
// callback sees every chunk, with bytes_read growing to bytes_total.
TEST_F(PrepareTest, ChunkingAndThreadsDoNotChangeTheOutput) {
  std::string text;
  std::vector<std::string> docs;
  const std::vector<std::string> lines = test::tiny_sentences(600, 3);
  for (size_t i = 0; i < lines.size(); i += 3) {
    docs.push_back(lines[i] + "\n" + lines[i + 1] + "\n" + lines[i + 2]);
    text += docs.back() + "\n\n";
  }
  const std::string path = write_file("a.txt", text);
  PrepareOptions opts;
  opts.append_eod = true;
  opts.threads = 2;
  opts.chunk_bytes = 1000;
  std::vector<int64_t> seen;
  opts.progress = [&](const PrepareStats& s) { seen.push_back(s.bytes_read); };
  PrepareStats s = expect_documents({path}, docs, opts);
  EXPECT_GT(seen.size(), 20u);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_EQ(seen.back(), s.bytes_total);
  EXPECT_EQ(s.bytes_total, static_cast<int64_t>(text.size()));
}

TEST_F(PrepareTest, MalformedJsonlNamesFileLineAndColumn) {
  const std::string path = write_file("bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"cut off}\n");
  try {
    prepare({path}, *tok_, (dir_ / "out").string(), {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ":2: col 19: unterminated string");
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ / "out.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "out.bin.tmp"));
}

TEST(JsonStringField, Errors) {
  auto error = [](std::string_view line) {
    try {
      json_string_field(line, "text", "f.jsonl:3");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(error("{\"text\": 12}"), "f.jsonl:3: field \"text\" is a number, expected a string");
  EXPECT_EQ(error("{\"text\": [\"a\"]}"),
            "f.jsonl:3: field \"text\" is an array, expected a string");
  EXPECT_EQ(error("{\"a\": 1, \"b\": \"x\"}"),
            "f.jsonl:3: no \"text\" field (fields: a, b); choose one with --json-key");
  EXPECT_EQ(error("[\"text\"]"), "f.jsonl:3: col 1: expected '{', found '['");
  EXPECT_EQ(error("{\"text\": \"a\"} {"),
            "f.jsonl:3: col 15: text after the JSON object (one object per line)");
  EXPECT_EQ(error("{\"text\": \"\\q\"}"), "f.jsonl:3: col 13: bad escape '\\q'");
  EXPECT_EQ(error("{\"text\": \"\\ud83d\"}"),
            "f.jsonl:3: col 17: unpaired UTF-16 surrogate in \\u escape");
  EXPECT_EQ(error("{\"x\": nope, \"text\": \"a\"}"), "f.jsonl:3: col 7: not a JSON value: 'nope'");
  EXPECT_EQ(json_string_field("{\"text\":\"a\\/b\\\\c\\u0041\"}", "text", "-"), "a/b\\cA");
  EXPECT_EQ(
      json_string_field("{\"text\": \"a\\n\\t\\\"b\\\" \\u00e9 \\ud83d\\ude00\"}", "text", "-"),
      "a\n\t\"b\" \xc3\xa9 \xf0\x9f\x98\x80");
}

// The documents themselves (SentencePiece's normalization would hide a '\n' read as ' ').
TEST_F(PrepareTest, DocumentReaderBlocksAndLines) {
  const std::string text = "\n a\r\nb\n \n\nc\n";
  const std::string path = write_file("r.txt", text);
  for (bool line_docs : {false, true}) {
    DocumentReader r(path, {.line_docs = line_docs});
    std::vector<std::string> docs;
    for (std::string d; r.next(d);) docs.push_back(d);
    const std::vector<std::string> want = line_docs ? std::vector<std::string>{" a", "b", "c"}
                                                    : std::vector<std::string>{" a\nb", "c"};
    EXPECT_EQ(docs, want);
    EXPECT_EQ(r.bytes_read(), static_cast<int64_t>(text.size()));
  }
}

}  // namespace
}  // namespace llmt
