// Blend assignment by earliest-deadline-first (see blend.h) with count checkpoints grown on
// demand, and reading a range of blended samples from the sources one sample at a time.
#include "data/blend.h"

#include "core/check.h"

namespace llmt {

Blend::Blend(std::vector<std::shared_ptr<const SampleSource>> sources, std::vector<double> weights)
    : sources_(std::move(sources)), weights_(std::move(weights)) {
  LLMT_CHECK(!sources_.empty() && sources_.size() == weights_.size(), sources_.size(),
             " sources with ", weights_.size(), " weights");
  for (size_t s = 0; s < weights_.size(); ++s) {
    LLMT_CHECK(weights_[s] > 0, "blend weight ", s, " = ", weights_[s], " must be > 0");
    LLMT_CHECK(sources_[s]->window() == sources_[0]->window(), "blend source ", s, " has window ",
               sources_[s]->window(), ", source 0 has ", sources_[0]->window());
    total_ += weights_[s];
  }
  checkpoints_.assign(sources_.size(), 0);
}

std::vector<double> Blend::weights() const {
  std::vector<double> w = weights_;
  for (double& x : w) x /= total_;
  return w;
}

int Blend::pick(int64_t n, const std::vector<int64_t>& counts) const {
  size_t best = 0;
  bool found = false;
  for (size_t s = 0; s < weights_.size(); ++s) {
    const double c = static_cast<double>(counts[s]);
    if (c * total_ > weights_[s] * static_cast<double>(n)) continue;  // c > w_s n: not released
    // deadline (c + 1) / w_s earlier than the best one's
    if (!found ||
        (c + 1) * weights_[best] < (static_cast<double>(counts[best]) + 1) * weights_[s]) {
      best = s;
      found = true;
    }
  }
  // Some source is always released: the counts sum to n - 1 < n = sum_s w_s n.
  return static_cast<int>(best);
}

void Blend::assign(int64_t first, int64_t n, int32_t* source, int64_t* index) const {
  LLMT_CHECK(first >= 0 && n >= 0, "blended samples [", first, ", ", first + n, ")");
  const size_t S = sources_.size();
  const int64_t c = first / kBlendCheckpoint;
  std::vector<int64_t> counts(S);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int64_t have = static_cast<int64_t>(checkpoints_.size() / S) - 1; have < c; ++have) {
      counts.assign(checkpoints_.end() - static_cast<std::ptrdiff_t>(S), checkpoints_.end());
      for (int64_t g = have * kBlendCheckpoint; g < (have + 1) * kBlendCheckpoint; ++g)
        ++counts[static_cast<size_t>(pick(g + 1, counts))];
      checkpoints_.insert(checkpoints_.end(), counts.begin(), counts.end());
    }
    const auto at = checkpoints_.begin() + static_cast<std::ptrdiff_t>(c * static_cast<int64_t>(S));
    counts.assign(at, at + static_cast<std::ptrdiff_t>(S));
  }
  for (int64_t g = c * kBlendCheckpoint; g < first + n; ++g) {
    const int s = pick(g + 1, counts);
    if (g >= first) {
      source[g - first] = s;
      index[g - first] = counts[static_cast<size_t>(s)];
    }
    ++counts[static_cast<size_t>(s)];
  }
}

void Blend::fill(int32_t* out, int64_t first, int64_t n) const {
  std::vector<int32_t> source(static_cast<size_t>(n));
  std::vector<int64_t> index(static_cast<size_t>(n));
  assign(first, n, source.data(), index.data());
  const int64_t W = window();
  for (int64_t k = 0; k < n; ++k)
    sources_[static_cast<size_t>(source[k])]->fill(out + k * W, index[k], 1);
}

}  // namespace llmt
