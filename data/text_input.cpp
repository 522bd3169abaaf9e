// Plain-text and JSONL document readers. Of each JSONL line (one object) the wanted top-level
// string field is decoded, every other value skipped without being decoded (config/json.h).
#include "data/text_input.h"

#include <cstring>

#include "config/json.h"
#include "core/check.h"

namespace llmt {

TextFormat text_format_of(const std::string& path) {
  auto ends_with = [&](const char* s) {
    const size_t n = std::strlen(s);
    return path.size() >= n && path.compare(path.size() - n, n, s) == 0;
  };
  return ends_with(".jsonl") || ends_with(".json") ? TextFormat::jsonl : TextFormat::text;
}

DocumentReader::DocumentReader(const std::string& path, const TextInputOptions& opts)
    : path_(path), opts_(opts), format_(text_format_of(path)), in_(path, std::ios::binary) {
  if (!in_) throw Error(detail::concat(path, ": cannot open: ", std::strerror(errno)));
}

bool DocumentReader::next_line() {
  if (!std::getline(in_, line_)) {
    if (in_.bad()) throw Error(detail::concat(path_, ": read failed after line ", line_no_));
    return false;
  }
  ++line_no_;
  bytes_read_ += static_cast<int64_t>(line_.size()) + (in_.eof() ? 0 : 1);
  if (!line_.empty() && line_.back() == '\r') line_.pop_back();
  return true;
}

namespace {
bool blank(const std::string& s) {
  return s.find_first_not_of(" \t\f\v") == std::string::npos;
}
}  // namespace

bool DocumentReader::next(std::string& doc) {
  doc.clear();
  if (format_ == TextFormat::jsonl) {
    while (next_line()) {
      if (blank(line_)) continue;
      doc = json_string_field(line_, opts_.json_key, detail::concat(path_, ":", line_no_));
      return true;
    }
    return false;
  }
  while (next_line()) {
    if (blank(line_)) {
      if (opts_.line_docs || doc.empty()) continue;
      return true;  // the blank line that ends a block
    }
    if (opts_.line_docs) {
      doc = line_;
      return true;
    }
    if (!doc.empty()) doc += '\n';
    doc += line_;
  }
  return !doc.empty();
}

std::string json_string_field(std::string_view line, std::string_view key,
                              const std::string& where) {
  JsonScanner js(line, where);
  js.expect('{');
  std::string name, value, keys;
  bool found = false;
  if (js.peek() == '}') {
    js.expect('}');
  } else {
    while (true) {
      name.clear();
      js.string(&name);
      js.expect(':');
      if (name == key && !found) {
        if (js.peek() != '"')
          throw Error(detail::concat(where, ": field \"", key, "\" is ", js.skip_value(),
                                     ", expected a string"));
        js.string(&value);
        found = true;
      } else {
        js.skip_value();
      }
      keys += detail::concat(keys.empty() ? "" : ", ", name);
      if (js.peek() == ',') {
        js.expect(',');
        continue;
      }
      js.expect('}');
      break;
    }
  }
  if (!js.at_end()) js.fail("text after the JSON object (one object per line)");
  if (!found)
    throw Error(detail::concat(where, ": no \"", key, "\" field (fields: ",
                               keys.empty() ? "none" : keys, "); choose one with --json-key"));
  return value;
}

}  // namespace llmt
