// Documents from raw text files, streamed: plain text (one document per blank-line-separated
// block, or per line) and JSONL (one JSON object per line, the document in a string field).
// Shared by tokenizer training and `data prepare`, so both see the same documents.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace llmt {

enum class TextFormat { text, jsonl };

// jsonl for names ending in .jsonl or .json, text otherwise.
TextFormat text_format_of(const std::string& path);

struct TextInputOptions {
  bool line_docs = false;         // text: every non-blank line is a document
  std::string json_key = "text";  // jsonl: the field that holds the document
};

class DocumentReader {
 public:
  // Throws Error if `path` cannot be opened.
  DocumentReader(const std::string& path, const TextInputOptions& opts);

  // The next document into `doc`, its lines joined by '\n' (no trailing newline, '\r' of CRLF
  // dropped); false at the end of the file. JSONL errors name path:line.
  bool next(std::string& doc);

  int64_t bytes_read() const { return bytes_read_; }
  const std::string& path() const { return path_; }

 private:
  bool next_line();  // into line_, false at EOF

  std::string path_;
  TextInputOptions opts_;
  TextFormat format_;
  std::ifstream in_;
  std::string line_;
  int64_t line_no_ = 0;
  int64_t bytes_read_ = 0;
};

// The value of the top-level string field `key` of the JSON object `line`, unescaped to UTF-8.
// Throws Error starting with `where` (e.g. "a.jsonl:17") on malformed JSON, a missing key or a
// value that is not a string.
std::string json_string_field(std::string_view line, std::string_view key,
                              const std::string& where);

}  // namespace llmt
