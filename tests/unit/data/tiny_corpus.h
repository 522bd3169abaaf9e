// A small generated English-like corpus and a tokenizer trained on it once per test binary, so
// the tokenizer and prepare tests stay fast (a 2,000-line text, a vocabulary of a few hundred).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace llmt::test {

// `n` sentences of 4-12 words from a fixed list, single-spaced, seeded (an LCG, so the text is
// the same on every platform).
inline std::vector<std::string> tiny_sentences(int n, uint64_t seed = 7) {
  static const char* const words[] = {
      "the",   "a",     "model", "learns", "from",  "text",   "every", "token",   "is",
      "one",   "piece", "of",    "words",  "and",   "data",   "flows", "through", "layers",
      "while", "loss",  "falls", "slowly", "quick", "brown",  "fox",   "jumps",   "over",
      "lazy",  "dog",   "under", "bright", "stars", "rivers", "run",   "to",      "sea"};
  uint64_t s = seed;
  auto next = [&s](uint64_t m) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (s >> 33) % m;
  };
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::string line;
    const uint64_t len = 4 + next(9);
    for (uint64_t w = 0; w < len; ++w) {
      if (w) line += ' ';
      line += words[next(std::size(words))];
    }
    line += next(4) == 0 ? "?" : ".";
    out.push_back(line);
  }
  return out;
}

inline void write_lines(const std::filesystem::path& path, const std::vector<std::string>& lines) {
  std::ofstream out(path);
  for (const std::string& l : lines) out << l << '\n';
}

// tok.model (bpe, vocab 200) trained on tiny_sentences(2000) once per process, in a folder
// removed at exit.
inline const std::string& tiny_tokenizer_path() {
  struct Trained {
    std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                ("llmt_tiny_tokenizer_" + std::to_string(::getpid()));
    std::string model = (dir / "tok.model").string();
    Trained() {
      std::filesystem::create_directories(dir);
      write_lines(dir / "corpus.txt", tiny_sentences(2000));
      TokenizerTrainOptions opts;
      opts.vocab_size = 200;
      train_tokenizer({(dir / "corpus.txt").string()}, model, opts);
    }
    ~Trained() { std::filesystem::remove_all(dir); }
  };
  static const Trained trained;
  return trained.model;
}

}  // namespace llmt::test
