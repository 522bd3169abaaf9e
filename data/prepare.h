// `data prepare`: text/JSONL documents -> token ids -> a Megatron indexed dataset. Streams in
// chunks of documents (memory bounded by the chunk, whatever the corpus size), tokenizes each
// chunk on all cores and writes its documents in input order.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/text_input.h"
#include "data/tokenizer.h"

namespace llmt {

struct PrepareStats {
  int64_t documents = 0;               // written, one sequence each
  int64_t empty_documents = 0;         // skipped: no tokens (as Megatron-LM's preprocessing does)
  int64_t tokens = 0;                  // written, end-of-document tokens included
  TokenDType dtype = TokenDType::u16;  // of the written tokens
  int64_t bytes_read = 0;              // of the input files
  int64_t bytes_total = 0;             // sum of the input file sizes
  double seconds = 0;
};

struct PrepareOptions {
  bool append_eod = false;        // the tokenizer's eos id after every document
  TextInputOptions input;         // line_docs, json_key
  int threads = 0;                // tokenizer threads; 0 = all cores
  int64_t chunk_bytes = 1 << 20;  // text read per parallel tokenization round
  // Called after every chunk with the stats so far, e.g. for a progress bar.
  std::function<void(const PrepareStats&)> progress;
};

// Writes output_prefix.bin/.idx (uint16 ids when the vocabulary fits, else int32). Inputs ending
// in .jsonl/.json are JSONL, others plain text. Throws Error on unreadable or malformed input
// (naming file:line) and when append_eod is asked of a tokenizer without an eos token.
PrepareStats prepare(const std::vector<std::string>& inputs, const Tokenizer& tokenizer,
                     const std::string& output_prefix, const PrepareOptions& opts);

}  // namespace llmt
