// A beam step's best candidates without ATen's topk where the answer is unambiguous.
// topk over a source's k·V candidate scores sorts pairs of (value, index) and costs tens
// of microseconds per source and step at a vocabulary of 8k, milliseconds at 256k. One
// scan that keeps the m + 1 best finds the same m where those m + 1 are distinct: the
// m best and their order are then fixed by the values alone. Ties (which topk orders in
// its own way), NaN and too few finite candidates leave the choice to topk.
#include "native.h"
#include "vec.h"

#include <limits>

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kMaxBest = 64;

// The best values seen so far, descending, at most `size`.
struct Best {
  int64_t size, count = 0;
  float value[kMaxBest + 1];
  int64_t index[kMaxBest + 1];
  bool nan = false;

  float threshold() const { return count < size ? -kInf : value[size - 1]; }

  void offer(float x, int64_t at) {
    if (x != x) {
      nan = true;
      return;
    }
    if (count == size && !(x > value[size - 1])) return;
    int64_t i = count < size ? count++ : size - 1;
    for (; i > 0 && value[i - 1] < x; --i) {
      value[i] = value[i - 1];
      index[i] = index[i - 1];
    }
    value[i] = x;
    index[i] = at;
  }
};

// Offers row r's candidates base + lp[t] (an fp32 add, as ATen's) that may enter `best`:
// eight at a time, most of which fall below the threshold. NaN passes the test.
CLONES void scan_row(Best& best, float base, const float* lp, int64_t vocab, int64_t offset) {
  int64_t t = 0;
  for (; t + 8 <= vocab; t += 8) {
    const v8f v = base + load<v8f>(lp + t);
    const float threshold = best.threshold();
    const v8i may = (v > threshold) | (v != v);
    bool any = false;
    for (int lane = 0; lane < 8; ++lane) any |= may[lane] != 0;
    if (!any) continue;
    for (int lane = 0; lane < 8; ++lane) best.offer(v[lane], offset + t + lane);
  }
  for (; t < vocab; ++t) best.offer(base + lp[t], offset + t);
}

}  // namespace

bool top_distinct(const float* base, const float* lprobs, int64_t rows, int64_t vocab, int64_t m,
                  float* values, int64_t* indices) {
  if (m + 1 > kMaxBest || rows * vocab <= m) return false;
  Best best{m + 1};
  for (int64_t r = 0; r < rows; ++r) {
    if (base[r] == -kInf) continue;  // all its candidates are -inf: below m + 1 distinct ones
    scan_row(best, base[r], lprobs + r * vocab, vocab, r * vocab);
  }
  if (best.nan || best.count < m + 1) return false;
  for (int64_t i = 0; i < m; ++i)
    if (!(best.value[i] > best.value[i + 1])) return false;
  std::copy(best.value, best.value + m, values);
  std::copy(best.index, best.index + m, indices);
  return true;
}

std::vector<Tensor> top_candidates(const Tensor& base_in, const Tensor& lprobs_in, int64_t m) {
  // base (N, h), lprobs (N, h, V) fp32: the m best of each row's base + lprobs, flattened,
  // where `top_distinct` decides them; `found` (N,) says where it did.
  Tensor base = base_in.contiguous(), lprobs = lprobs_in.contiguous();
  const int64_t n = base.size(0), rows = base.size(1), vocab = lprobs.size(2);
  Tensor values = at::full({n, m}, -kInf, base.options());
  Tensor indices = at::zeros({n, m}, base.options().dtype(at::kLong));
  Tensor found = at::zeros({n}, base.options().dtype(at::kBool));
  for (int64_t s = 0; s < n; ++s)
    found.data_ptr<bool>()[s] = top_distinct(
        base.data_ptr<float>() + s * rows, lprobs.data_ptr<float>() + s * rows * vocab, rows,
        vocab, m, values.data_ptr<float>() + s * m, indices.data_ptr<int64_t>() + s * m);
  return {values, indices, found};
}
