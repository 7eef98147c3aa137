// The lean decoder's layer loop (specbeam/kernels/lean_decoder.py) in C++: the same ATen
// ops on the same tensors, in the same order, so the same numbers. Called once per
// decoder call instead of ~30 Python-dispatched ops per layer: on a 2-core CPU a call
// streams the weights through the caches, and every small op after a product then pays
// for an evicted interpreter (specbeam/kernels/native.py has the measurements).
#include "native.h"
#include "vec.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace {

// Product kinds, as specbeam.kernels.onednn: TORCH, MKL, ONEDNN, BF16, INT8, FEW_ROWS,
// INT8_FBGEMM.
constexpr int64_t kTorch = 0, kMkl = 1, kOnednn = 2, kBf16 = 3, kInt8 = 4, kFewRows = 5,
                  kInt8Fbgemm = 6;
constexpr double kTiny = 1e-30;  // quant._TINY
constexpr int64_t kGrain = 32768;  // elements a thread takes at least

Tensor boxed(const c10::OperatorHandle& op, torch::jit::Stack stack) {
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

std::vector<int64_t> out_shape(const Tensor& x, int64_t width) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = width;
  return shape;
}

// quant.int8_product's torch ops as two passes over rows [begin, end), 16 lanes at a time:
// the same IEEE operations in the same order per element, so the same bits (the extension
// is built with -ffp-contract=off: no product fused with the add after it). Rounding adds
// and subtracts 1.5 · 2^23, which rounds |x| < 2^22 half to even, as torch.round.
CLONES void quantise_rows(const float* in, int64_t width, float tiny, float* a, int8_t* out,
                          int64_t begin, int64_t end) {
  constexpr float kRound = 12582912.0f;
  const int64_t whole = width / kLanes * kLanes;
  for (int64_t r = begin; r < end; ++r) {
    const float* row = in + r * width;
    v16f lanes = {};
    for (int64_t j = 0; j < whole; j += kLanes) {
      v16f x = load<v16f>(row + j);
      x = x < 0 ? -x : x;
      lanes = x > lanes ? x : lanes;
    }
    float top = 0.0f;  // a maximum: exact in any order
    for (int i = 0; i < kLanes; ++i) top = std::max(top, lanes[i]);
    for (int64_t j = whole; j < width; ++j) top = std::max(top, std::fabs(row[j]));
    const float scale = std::max(top, tiny) / 127.0f;
    a[r] = scale;
    int8_t* q = out + r * width;
    for (int64_t j = 0; j < whole; j += kLanes) {
      const v16f x = load<v16f>(row + j);
      store(q + j, __builtin_convertvector(
                       __builtin_convertvector((x / scale + kRound) - kRound, v16i), v16c));
    }
    for (int64_t j = whole; j < width; ++j)
      q[j] = static_cast<int8_t>((row[j] / scale + kRound) - kRound);
  }
}

CLONES void scale_rows(const int32_t* sums, const float* scales, const float* a, const float* bias,
                       int64_t outs, float* out, int64_t begin, int64_t end) {
  const int64_t whole = outs / kLanes * kLanes;
  for (int64_t r = begin; r < end; ++r) {
    const int32_t* row = sums + r * outs;
    float* o = out + r * outs;
    for (int64_t c = 0; c < whole; c += kLanes) {
      v16f y = __builtin_convertvector(load<v16i>(row + c), v16f) * load<v16f>(scales + c) * a[r];
      if (bias) y = y + load<v16f>(bias + c);
      store(o + c, y);
    }
    for (int64_t c = whole; c < outs; ++c) {
      const float y = static_cast<float>(row[c]) * scales[c] * a[r];
      o[c] = bias ? y + bias[c] : y;
    }
  }
}

}  // namespace

// quant.int8_product: each row quantised with its own scale, int32 sums, then the scales;
// at a step's few rows its ten torch ops cost more in dispatch than in arithmetic. The sums
// run on `_int_mm` over q (in, out), or on fbgemm over its packed copy (int8_sums.cpp).
Tensor int8_product(const Tensor& x, bool fbgemm, const Tensor& q, const Tensor& scales,
                    const MaybeTensor& b) {
  const int64_t width = x.size(-1), rows = x.numel() / width, outs = scales.size(0);
  const Tensor x2 = x.reshape({rows, width}).contiguous();
  Tensor qx = at::empty({rows, width}, x.options().dtype(at::kChar));
  std::vector<float> a(rows);
  at::parallel_for(0, rows, kGrain / width + 1, [&](int64_t begin, int64_t end) {
    quantise_rows(x2.data_ptr<float>(), width, static_cast<float>(kTiny), a.data(),
                  qx.data_ptr<int8_t>(), begin, end);
  });
  const Tensor sums = fbgemm ? int8_sums(qx, q) : at::_int_mm(qx, q);
  Tensor out = at::empty({rows, outs}, x.options());
  at::parallel_for(0, rows, kGrain / outs + 1, [&](int64_t begin, int64_t end) {
    scale_rows(sums.data_ptr<int32_t>(), scales.data_ptr<float>(), a.data(),
               b ? b->data_ptr<float>() : nullptr, outs, out.data_ptr<float>(), begin, end);
  });
  return out.view(out_shape(x, outs));
}

namespace {

// quant.bf16_product: bf16 inputs and weights, fp32 output and bias.
Tensor bf16_product(const Tensor& x, const Tensor& w, const MaybeTensor& b) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  Tensor xb = x.to(at::kBFloat16);
  Tensor out = w.is_mkldnn() ? boxed(op, {xb, w, MaybeTensor(), std::string("none"),
                                          c10::List<std::optional<c10::Scalar>>(), std::string("")})
                             : at::linear(xb, w);
  out = out.to(at::kFloat);
  if (b) out.add_(*b);
  return out;
}

// onednn.Product.__call__: x (..., in) -> (..., out).
Tensor product(const Tensor& x, int64_t kind, const Tensor& w, const MaybeTensor& b,
               const MaybeTensor& packed, const MaybeTensor& scales) {
  if (kind == kInt8 || kind == kInt8Fbgemm)
    return int8_product(x, kind == kInt8Fbgemm, *packed, *scales, b);
  if (kind == kBf16) return bf16_product(x, *packed, b);
  if (kind == kFewRows) return few_rows_product(x, w, b);
  if (kind == kMkl) {
    static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkl::_mkl_linear", "");
    const int64_t rows = x.numel() / x.size(-1);
    Tensor out = boxed(op, {x.reshape({rows, x.size(-1)}), *packed, w, b, rows});
    return out.view(out_shape(x, w.size(0)));
  }
  if (kind == kOnednn) {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
    return boxed(op, {x, *packed, b, std::string("none"),
                      c10::List<std::optional<c10::Scalar>>(), std::string("")});
  }
  return at::linear(x, w, b);
}

struct Packing {
  MaybeTensor index;  // (N,) flat indices of the valid slots into S·T
  int64_t s, t;

  Tensor pack(const Tensor& x) const {
    return index ? x.flatten(0, 1).index_select(0, *index) : x;
  }
  Tensor unpack(const Tensor& x) const {
    if (!index) return x;
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape[0] = s * t;
    return x.new_zeros(shape).index_copy_(0, *index, x).unflatten(0, {s, t});
  }
};

// lean_decoder._attend where the extension is built: q (S, T, H, D), k and v (S, K, H, D)
// -> (S, T, H·D); fp32 through attention.cpp (NativeLayers.problem: a head dim it holds),
// other dtypes (a bf16 draft) through torch's SDPA.
Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, const MaybeTensor& bias) {
  if (q.scalar_type() == at::kFloat) return ordered_attention(q, k, v, bias);
  Tensor out = at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                v.transpose(1, 2), bias);
  return out.transpose(1, 2).flatten(2);
}

Tensor norm(const Tensor& x, const MaybeTensor& w, const MaybeTensor& b, double eps) {
  return at::layer_norm(x, {x.size(-1)}, w, b, eps);
}

}  // namespace

// Per layer, `tensors` holds kTensorsPerLayer entries: three norms (weight, bias), six
// products (weight, bias, packed copy, int8 scales: q/k/v stacked, self output, cross q,
// cross output, inner, output), then the cache's keys and values (S, keys, H, D), and the
// source's cross keys and values (S, K, H, D). `ints` holds, per layer, the six products'
// kinds, the q/k/v widths and the head dim; `eps` the three norms' epsilons. Then the final
// norm (weight, bias; eps last). Returns the final states, then the outputs of `taps`.
extern const size_t kTensorsPerLayer = 6 + 24 + 4;
extern const size_t kIntsPerLayer = 6 + 3 + 1;

std::vector<Tensor> decode(Tensor x, const std::vector<MaybeTensor>& tensors,
                           const std::vector<int64_t>& ints, const std::vector<double>& eps,
                           int64_t num_layers, int64_t start, const Tensor& self_bias,
                           const MaybeTensor& cross_bias, const MaybeTensor& pack_index,
                           const std::vector<int64_t>& taps) {
  const int64_t s = x.size(0), t = x.size(1);
  const Packing packing{pack_index, s, t};
  std::vector<Tensor> out(1);
  x = packing.pack(x);
  for (int64_t l = 0; l < num_layers; ++l) {
    const MaybeTensor* p = &tensors[l * kTensorsPerLayer];
    const int64_t* n = &ints[l * kIntsPerLayer];
    const double* e = &eps[l * 3];
    const MaybeTensor* w = p + 6;  // products: w[4 * i] .. w[4 * i + 3]
    auto run = [&](int i, const Tensor& in) {
      return product(in, n[i], *w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
    };
    const int64_t head_dim = n[9];
    const Tensor &keys = *p[30], &values = *p[31], &cross_k = *p[32], &cross_v = *p[33];

    Tensor h = norm(x, p[0], p[1], e[0]);
    auto qkv = run(0, h).split_with_sizes({n[6], n[7], n[8]}, -1);
    Tensor q = packing.unpack(qkv[0]).unflatten(-1, {-1, head_dim});
    Tensor k = packing.unpack(qkv[1]).unflatten(-1, {-1, head_dim});
    Tensor v = packing.unpack(qkv[2]).unflatten(-1, {-1, head_dim});
    keys.narrow(1, start, t).copy_(k);
    values.narrow(1, start, t).copy_(v);
    Tensor a = packing.pack(
        attend(q, keys.narrow(1, 0, start + t), values.narrow(1, 0, start + t), self_bias));
    x = x + run(1, a);
    h = norm(x, p[2], p[3], e[1]);
    q = packing.unpack(run(2, h)).unflatten(-1, {-1, head_dim});
    a = packing.pack(attend(q, cross_k, cross_v, cross_bias));
    x = x + run(3, a);
    h = norm(x, p[4], p[5], e[2]);
    x = x + run(5, at::relu(run(4, h)));
    for (int64_t tap : taps) {
      if (tap == l) out.push_back(x);
    }
  }
  const MaybeTensor* f = &tensors[num_layers * kTensorsPerLayer];
  out[0] = norm(x, f[0], f[1], eps[num_layers * 3]);
  return out;
}

// TreeDecoder.forward's self-attention mask: query slot t of source s sees position c
// of the cached prefix in column column[s, t, c] (positions < lens[s]) and the slots
// `visible` says it sees. Additive, (S, 1, T, width·k + slots).
Tensor tree_bias(const Tensor& lens, int64_t k, const Tensor& column, const Tensor& visible,
                 c10::ScalarType dtype) {
  if (dtype == at::kFloat) {  // the same mask as the ops below, by one loop
    const Tensor len = lens.contiguous(), col = column.contiguous(), sees = visible.contiguous();
    const int64_t num_sources = col.size(0), slots = col.size(1), width = col.size(2);
    const int64_t keys = width * k + sees.size(2);
    Tensor bias = at::empty({num_sources, 1, slots, keys}, visible.options().dtype(dtype));
    const int64_t *n = len.data_ptr<int64_t>(), *c = col.data_ptr<int64_t>();
    const bool* v = sees.data_ptr<bool>();
    float* out = bias.data_ptr<float>();
    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    for (int64_t s = 0; s < num_sources; ++s)
      for (int64_t t = 0; t < slots; ++t) {
        float* row = out + (s * slots + t) * keys;
        const int64_t* own = c + (s * slots + t) * width;
        std::fill(row, row + width * k, kMasked);
        for (int64_t p = 0; p < std::min(width, n[s]); ++p)
          if (own[p] >= 0 && own[p] < k) row[p * k + own[p]] = 0.0f;
        const bool* seen = v + (s * slots + t) * sees.size(2);
        for (int64_t b = 0; b < sees.size(2); ++b) row[width * k + b] = seen[b] ? 0.0f : kMasked;
      }
    return bias;
  }
  Tensor cached = at::arange(column.size(2), lens.options()).unsqueeze(0) < lens.unsqueeze(1);
  Tensor own = column.unsqueeze(3) == at::arange(k, column.options());
  Tensor prefix = cached.unsqueeze(1).unsqueeze(3) & own;
  Tensor mask = at::cat({prefix.flatten(2), visible}, 2);
  Tensor bias = at::zeros(mask.sizes(), mask.options().dtype(dtype));
  return bias.masked_fill_(mask.logical_not(), -std::numeric_limits<double>::infinity())
      .unsqueeze(1);
}
