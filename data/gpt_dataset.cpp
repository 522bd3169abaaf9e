// GPT sample indexing (see gpt_dataset.h). Megatron "sequences" are the documents here, as in
// Megatron's GPTDataset. Shuffles are Fisher-Yates with counter-based draws keyed by (seed,
// split, epoch, position), so an epoch's order is rebuilt identically whenever it is needed.
#include "data/gpt_dataset.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "core/rng.h"

namespace llmt {

namespace {

using detail::concat;

// Uniform integer in [0, bound) from a 64-bit draw (multiply-shift; bias below bound / 2^64).
int64_t below(uint64_t r, int64_t bound) {
  return static_cast<int64_t>((static_cast<unsigned __int128>(r) * static_cast<uint64_t>(bound)) >>
                              64);
}

// Fisher-Yates: position i swaps with a draw keyed by (seed, stream, i).
void shuffle(std::vector<int64_t>& v, uint64_t seed, uint64_t stream) {
  for (int64_t i = static_cast<int64_t>(v.size()) - 1; i > 0; --i) {
    std::swap(
        v[static_cast<size_t>(i)],
        v[static_cast<size_t>(below(rng::key(seed, stream, static_cast<uint64_t>(i)), i + 1))]);
  }
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

}  // namespace

std::string_view split_name(Split s) {
  constexpr std::string_view names[] = {"train", "valid", "test"};
  return names[static_cast<size_t>(s)];
}

std::optional<SplitWeights> parse_split(std::string_view text) {
  SplitWeights w{};
  double sum = 0;
  for (size_t k = 0; k < w.size(); ++k) {
    const size_t comma = text.find(',');
    if ((comma == std::string_view::npos) != (k + 1 == w.size())) return std::nullopt;
    const std::string_view part = trim(text.substr(0, comma));
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), w[k]);
    if (ec != std::errc() || end != part.data() + part.size() || !std::isfinite(w[k]) || w[k] < 0)
      return std::nullopt;
    sum += w[k];
    text.remove_prefix(comma == std::string_view::npos ? text.size() : comma + 1);
  }
  if (!(sum > 0) || !std::isfinite(sum)) return std::nullopt;
  return w;
}

std::array<int64_t, 4> split_boundaries(int64_t n, const SplitWeights& w) {
  const double total = w[0] + w[1] + w[2];
  std::array<int64_t, 4> b{0, 0, 0, n};
  double cumulative = 0;
  for (size_t s = 1; s < 3; ++s) {
    cumulative += w[s - 1];
    b[s] = std::min(
        n, static_cast<int64_t>(std::llround(static_cast<double>(n) * cumulative / total)));
  }
  return b;
}

GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> data, Split split,
                       const SplitWeights& weights, uint64_t seed, int64_t seq_len)
    : data_(std::move(data)), split_(split), seed_(seed), seq_len_(seq_len) {
  LLMT_CHECK(seq_len >= 1, "seq_len=", seq_len, " must be >= 1");
  const int64_t n_all = data_->num_sequences();
  const std::array<int64_t, 4> b = split_boundaries(n_all, weights);
  const size_t s = static_cast<size_t>(split);
  first_doc_ = b[s];
  lengths_.resize(static_cast<size_t>(b[s + 1] - b[s]));
  for (size_t p = 0; p < lengths_.size(); ++p) {
    lengths_[p] = data_->sequence_length(first_doc_ + static_cast<int64_t>(p));
    tokens_ += lengths_[p];
  }
  samples_ = tokens_ >= 1 ? (tokens_ - 1) / seq_len_ : 0;
  if (samples_ < 1) {
    throw Error(concat(data_->prefix(), ": the ", split_name(split), " split (documents [", b[s],
                       ", ", b[s + 1], ") of ", n_all, " with split weights ", weights[0], ",",
                       weights[1], ",", weights[2], ") holds ", tokens_,
                       " tokens, fewer than seq_len + 1 = ", seq_len_ + 1,
                       ": no sample fits; use more data or give this split a larger weight"));
  }
}

std::shared_ptr<const GptDataset::Epoch> GptDataset::epoch(int64_t e) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t k = 0; k < recent_.size(); ++k) {
    if (recent_[k] && recent_[k]->number == e) {
      if (k != 0) std::swap(recent_[0], recent_[k]);
      return recent_[0];
    }
  }
  const std::string name = concat("gpt.", split_name(split_));
  const uint64_t docs_stream = rng::key(seed_, rng::hash_name(name + ".documents"), e);
  const uint64_t windows_stream = rng::key(seed_, rng::hash_name(name + ".samples"), e);
  auto ep = std::make_shared<Epoch>();
  ep->number = e;
  ep->docs.resize(lengths_.size());
  std::iota(ep->docs.begin(), ep->docs.end(), first_doc_);
  shuffle(ep->docs, seed_, docs_stream);
  ep->starts.resize(lengths_.size() + 1);
  ep->starts[0] = 0;
  for (size_t p = 0; p < ep->docs.size(); ++p)
    ep->starts[p + 1] = ep->starts[p] + lengths_[static_cast<size_t>(ep->docs[p] - first_doc_)];
  ep->windows.resize(static_cast<size_t>(samples_));
  std::iota(ep->windows.begin(), ep->windows.end(), int64_t{0});
  shuffle(ep->windows, seed_, windows_stream);
  recent_[1] = std::move(recent_[0]);
  recent_[0] = std::move(ep);
  return recent_[0];
}

std::vector<int64_t> GptDataset::epoch_documents(int64_t e) const {
  return epoch(e)->docs;
}

void GptDataset::fill(int32_t* out, int64_t first, int64_t n) const {
  LLMT_CHECK(first >= 0 && n >= 0, "samples [", first, ", ", first + n, ") of ", data_->prefix());
  const int64_t W = window();
  std::shared_ptr<const Epoch> ep;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = first + k;
    if (!ep || ep->number != i / samples_) ep = epoch(i / samples_);
    const int64_t pos = ep->windows[static_cast<size_t>(i % samples_)] * seq_len_;
    // The document holding token `pos`: the last p with starts[p] <= pos (skips empty ones).
    size_t p = static_cast<size_t>(std::upper_bound(ep->starts.begin(), ep->starts.end(), pos) -
                                   ep->starts.begin() - 1);
    int64_t offset = pos - ep->starts[p];
    int32_t* row = out + k * W;
    for (int64_t need = W; need > 0; ++p, offset = 0) {
      const int64_t take = std::min(need, ep->starts[p + 1] - ep->starts[p] - offset);
      if (take <= 0) continue;
      data_->read(ep->docs[p], offset, take, row);
      row += take;
      need -= take;
    }
  }
}

}  // namespace llmt
