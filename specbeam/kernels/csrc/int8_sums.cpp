// int8 × int8 sums on CPUs without int8 dot products (AVX2 alone), where torch's `_int_mm`
// is a scalar loop: fbgemm's packed u8 × s8 GEMM, which torch ships. AVX2 multiplies
// u8 × s8 pairs and adds each two into 16 bits with saturation; inputs shifted to u8
// (x + 128 ≤ 255) times weights within ±63 (quant.weight_levels) stay below 2^15, so every
// sum is the exact integer `_int_mm` gives, whatever the rows beside it.
#include "native.h"

#include <ATen/Parallel.h>
#include <fbgemm/Fbgemm.h>

#include <memory>

namespace {

constexpr int32_t kShift = 128;  // int8 x -> uint8 x + 128

struct PackedInt8 {
  std::unique_ptr<fbgemm::PackBMatrix<int8_t>> b;
  std::vector<int32_t> column_sums;  // per output: Σ_in q, to take the shift's 128 · Σ q off
  int64_t in, out;
};

const PackedInt8& unwrap(const Tensor& handle) {
  return *static_cast<const PackedInt8*>(handle.data_ptr());
}

}  // namespace

// q (out, in) int8 -> a handle: a one-byte tensor whose storage owns fbgemm's packed copy, so
// that it travels and dies as the packed oneDNN weights do.
Tensor int8_pack(const Tensor& q) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar && q.is_contiguous(),
              "int8_pack takes a contiguous (out, in) int8 weight");
  auto packed = std::make_unique<PackedInt8>();
  packed->out = q.size(0);
  packed->in = q.size(1);
  packed->b = std::make_unique<fbgemm::PackBMatrix<int8_t>>(
      fbgemm::matrix_op_t::Transpose, packed->in, packed->out, q.data_ptr<int8_t>(), packed->in,
      nullptr, 1);
  const Tensor sums = q.sum(1, false, at::kInt);
  packed->column_sums.assign(sums.data_ptr<int32_t>(), sums.data_ptr<int32_t>() + packed->out);
  void* owner = packed.release();
  return torch::from_blob(
      owner, {1}, [](void* p) { delete static_cast<PackedInt8*>(p); },
      torch::TensorOptions().dtype(at::kByte));
}

// qx (rows, in) int8 -> (rows, out) int32: Σ_in qx · q, exactly.
Tensor int8_sums(const Tensor& qx, const Tensor& handle) {
  const PackedInt8& w = unwrap(handle);
  TORCH_CHECK(qx.dim() == 2 && qx.size(1) == w.in && qx.scalar_type() == at::kChar,
              "int8_sums takes (rows, in) int8 inputs");
  const int64_t rows = qx.size(0);
  const Tensor u = qx.contiguous().view(at::kByte).bitwise_xor(kShift);  // x + 128
  Tensor out = at::empty({rows, w.out}, qx.options().dtype(at::kInt));
  int32_t* c = out.data_ptr<int32_t>();
  const int tasks = at::get_num_threads();
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      fbgemm::PackAMatrix<uint8_t> a(fbgemm::matrix_op_t::NoTranspose, rows, w.in,
                                     u.data_ptr<uint8_t>(), w.in, nullptr, 1);
      fbgemm::DoNothing<int32_t, int32_t> nothing{};
      fbgemm::memCopy<> copy(nothing);
      fbgemm::fbgemmPacked(a, *w.b, c, c, static_cast<int32_t>(w.out), copy,
                           static_cast<int>(task), tasks);
    }
  });
  const int32_t* sums = w.column_sums.data();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t j = 0; j < w.out; ++j) c[r * w.out + j] -= kShift * sums[j];
  });
  return out;
}
