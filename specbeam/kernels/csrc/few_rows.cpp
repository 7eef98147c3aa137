// fp32 products over a few rows (onednn.FEW_ROWS): y = x @ w^T + b for the 1 to 8 rows of a
// batch-1 decoder call. Such a product streams the weight once and does little else, but
// oneDNN's op spends tens of microseconds per call around its kernel (attributes, memory
// descriptors, allocations) and a decoder call makes ~40 of them. This one reads the
// weight as it lies, (out, in) row-major, so it needs no packed copy.
//
// Each (row, output) is summed in 8 lanes over `in` in order, then across the lanes in a
// fixed tree: a row's result does not depend on how many rows share the call.
#include "native.h"
#include "vec.h"

#include <ATen/Parallel.h>

#include <algorithm>

namespace {

constexpr int64_t kMaxRows = 8;  // rows per pass over the weight (onednn.MAX_FEW_ROWS)
constexpr int64_t kGrain = 32768;  // weight elements a thread takes at least

INLINE float lanes_sum(v8f a) {
  v4f s = v4f{a[0], a[1], a[2], a[3]} + v4f{a[4], a[5], a[6], a[7]};
  return (s[0] + s[2]) + (s[1] + s[3]);
}

// Outputs [j, j + O) of R rows. One row's single output is one dependency chain of adds;
// a row alone takes four outputs at a time to keep four chains in flight.
template <int R, int O>
INLINE void outputs(const float* x, const float* w, const float* b, int64_t in, int64_t out,
                    int64_t j, float* y) {
  v8f acc[R][O];
  UNROLLED for (int r = 0; r < R; ++r) UNROLLED for (int o = 0; o < O; ++o) acc[r][o] = v8f{};
  for (int64_t k = 0; k < in; k += 8) {
    v8f xs[R];
    UNROLLED for (int r = 0; r < R; ++r) xs[r] = load<v8f>(x + r * in + k);
    UNROLLED for (int o = 0; o < O; ++o) {
      const v8f wv = load<v8f>(w + (j + o) * in + k);
      UNROLLED for (int r = 0; r < R; ++r) acc[r][o] += wv * xs[r];
    }
  }
  UNROLLED for (int r = 0; r < R; ++r) UNROLLED for (int o = 0; o < O; ++o) {
    const float sum = lanes_sum(acc[r][o]);
    y[r * out + j + o] = b != nullptr ? sum + b[j + o] : sum;
  }
}

template <int R>
CLONES void rows_product(const float* x, const float* w, const float* b, int64_t in, int64_t out,
                         int64_t begin, int64_t end, float* y) {
  constexpr int O = R == 1 ? 4 : 1;
  int64_t j = begin;
  for (; j + O <= end; j += O) outputs<R, O>(x, w, b, in, out, j, y);
  for (; j < end; ++j) outputs<R, 1>(x, w, b, in, out, j, y);
}

void rows_of(int64_t rows, const float* x, const float* w, const float* b, int64_t in,
             int64_t out, int64_t begin, int64_t end, float* y) {
  switch (rows) {
    case 1: return rows_product<1>(x, w, b, in, out, begin, end, y);
    case 2: return rows_product<2>(x, w, b, in, out, begin, end, y);
    case 3: return rows_product<3>(x, w, b, in, out, begin, end, y);
    case 4: return rows_product<4>(x, w, b, in, out, begin, end, y);
    case 5: return rows_product<5>(x, w, b, in, out, begin, end, y);
    case 6: return rows_product<6>(x, w, b, in, out, begin, end, y);
    case 7: return rows_product<7>(x, w, b, in, out, begin, end, y);
    default: return rows_product<8>(x, w, b, in, out, begin, end, y);
  }
}

}  // namespace

Tensor few_rows_product(const Tensor& x, const Tensor& w, const MaybeTensor& b) {
  const int64_t in = x.size(-1), out = w.size(0);
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat,
              "few_rows_product: fp32 only");
  TORCH_CHECK(w.dim() == 2 && w.size(1) == in && w.is_contiguous() && in % 8 == 0,
              "few_rows_product: a contiguous (out, in) weight, in a multiple of 8");
  TORCH_CHECK(!b || (b->is_contiguous() && b->numel() == out && b->scalar_type() == at::kFloat),
              "few_rows_product: an fp32 bias of the weight's outputs");
  const Tensor rows_in = x.reshape({-1, in}).contiguous();
  const int64_t rows = rows_in.size(0);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out;
  Tensor y = at::empty({rows, out}, x.options());
  const float* xp = rows_in.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  const float* bp = b ? b->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, out, std::max<int64_t>(8, kGrain / in), [&](int64_t begin, int64_t end) {
    for (int64_t r = 0; r < rows; r += kMaxRows) {
      rows_of(std::min(kMaxRows, rows - r), xp + r * in, wp, bp, in, out, begin, end,
              yp + r * out);
    }
  });
  return y.view(shape);
}
