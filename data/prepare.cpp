// `data prepare`: read a chunk of documents (serial, cheap), tokenize it with OpenMP across the
// cores (SentencePiece encoding is ~all the time), append it to the writer in input order, repeat.
#include "data/prepare.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "core/check.h"
#include "data/indexed_dataset_writer.h"

namespace llmt {

PrepareStats prepare(const std::vector<std::string>& inputs, const Tokenizer& tokenizer,
                     const std::string& output_prefix, const PrepareOptions& opts) {
  const auto start = std::chrono::steady_clock::now();
  const int32_t eod = tokenizer.eos_id();
  if (opts.append_eod && eod < 0)
    throw Error(detail::concat(tokenizer.path(),
                               ": the model has no end-of-sequence token "
                               "(eos_id = -1) to append; leave out --append-eod "
                               "or train a model with one"));
  const int threads = opts.threads > 0 ? opts.threads : omp_get_max_threads();

  PrepareStats stats;
  for (const std::string& path : inputs) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) throw Error(detail::concat(path, ": cannot read: ", ec.message()));
    stats.bytes_total += static_cast<int64_t>(size);
  }
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };

  IndexedDatasetWriter writer(output_prefix, tokenizer.vocab_size());
  stats.dtype = writer.dtype();
  // Per chunk: the texts and their byte offsets; per thread: the tokens of its documents back to
  // back (eod included) and where each document ends. All bounded by the chunk size.
  struct Part {
    std::vector<int32_t> tokens;
    std::vector<int64_t> ends;
  };
  std::vector<std::string> docs;  // (n)
  std::vector<int64_t> starts;    // (n)
  std::vector<Part> parts(threads);
  int64_t bytes_before = 0;  // of the files already finished
  for (const std::string& path : inputs) {
    DocumentReader reader(path, opts.input);
    bool more = true;
    while (more) {
      docs.clear();
      starts.clear();
      int64_t chunk = 0;
      for (std::string doc; chunk < opts.chunk_bytes && (more = reader.next(doc));) {
        starts.push_back(chunk);
        chunk += static_cast<int64_t>(doc.size());
        docs.push_back(std::move(doc));
      }
      const int64_t n = static_cast<int64_t>(docs.size());
      for (Part& p : parts) {
        p.tokens.clear();
        p.ends.clear();
      }
      std::exception_ptr error;
      // Thread t encodes the documents starting in bytes [t*chunk/T, (t+1)*chunk/T): contiguous
      // ranges of about equal text, so parts[0], parts[1], ... hold the documents in input order.
#pragma omp parallel num_threads(threads)
      {
        const int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
        auto first_from = [&](int64_t byte) {
          return std::lower_bound(starts.begin(), starts.end(), byte) - starts.begin();
        };
        const int64_t lo = first_from(t * chunk / T);
        const int64_t hi = t == T - 1 ? n : first_from((t + 1) * chunk / T);
        Part& part = parts[t];
        std::vector<int32_t> ids;
        try {
          for (int64_t i = lo; i < hi; ++i) {
            tokenizer.encode(docs[i], ids);
            if (opts.append_eod && !ids.empty()) ids.push_back(eod);
            part.tokens.insert(part.tokens.end(), ids.begin(), ids.end());
            part.ends.push_back(static_cast<int64_t>(part.tokens.size()));
          }
        } catch (...) {
#pragma omp critical(llmt_prepare_error)
          if (!error) error = std::current_exception();
        }
      }
      if (error) std::rethrow_exception(error);
      for (const Part& p : parts) {
        for (size_t k = 0; k < p.ends.size(); ++k) {
          const int64_t begin = k ? p.ends[k - 1] : 0, len = p.ends[k] - begin;
          if (len == 0) {
            ++stats.empty_documents;
            continue;
          }
          writer.add_document(std::span(p.tokens).subspan(begin, len));
          ++stats.documents;
          stats.tokens += len;
        }
      }
      stats.bytes_read = bytes_before + reader.bytes_read();
      stats.seconds = elapsed();
      if (opts.progress) opts.progress(stats);
    }
    bytes_before += reader.bytes_read();
  }
  writer.finalize();
  stats.seconds = elapsed();
  return stats;
}

}  // namespace llmt
