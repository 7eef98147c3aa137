// Attention whose result for a query depends only on the keys it sees and their order:
// each query sums over its visible keys one after another, in key order, skipping the
// masked ones. A quantized target rounds attention's outputs to 8 bits in the next
// product, so a verification (tree slots beside the cached prefix, other queries beside
// it) must compute a query's attention bit for bit as a plain step does; a blocked
// kernel's sums follow the keys' positions and the number of queries (specbeam/search/
// attention.py). Skipping the masked keys also skips the other hypotheses' prefixes that
// the cache interleaves with a query's own (specbeam/search/cache.py).
#include "native.h"
#include "vec.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

namespace {

constexpr float kMasked = -std::numeric_limits<float>::infinity();
constexpr int64_t kMaxChunks = 8;  // head dims up to 128 in vector registers

// The kernel computes in 8-lane vectors: AVX2 keeps them in registers, where GCC lowers
// 64-byte ones through the stack. A head's dot product still sums 16 lanes (two halves,
// lo and hi), as in the clones that could hold them in one register: the same bits on
// every CPU.
constexpr int64_t kHalf = 8;

// lo + hi, then the 8 lanes summed in a fixed tree.
INLINE float sum(v8f lo, v8f hi) {
  const v8f b = lo + hi;
  v4f c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
  return (c[0] + c[2]) + (c[1] + c[3]);
}

// Cephes' expf on 8 lanes (x <= 0 here): each lane's result depends on its own input.
INLINE v8f exp8(v8f x) {
  const v8f floor_x = x - x - 87.0f;
  x = x < floor_x ? floor_x : x;
  const v8f fx = x * 1.44269504088896341f + 0.5f;
  v8i n = __builtin_convertvector(fx, v8i);
  n += __builtin_convertvector(n, v8f) > fx;  // truncated towards zero: -1 more below it
  const v8f nf = __builtin_convertvector(n, v8f);
  x = x - nf * 0.693359375f - nf * -2.12194440e-4f;
  v8f y = x * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * x * x + x + 1.0f;
  const v8i bits = (n + 127) << 23;
  v8f scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

struct Problem {
  const float *q, *k, *v, *bias;  // q (S, T, H, D), k and v (S, K, H, D), bias (S, T, K)
  int64_t q_s, q_t, k_s, k_k, v_s, v_k, b_s, b_t;  // strides, in elements
  int64_t t, keys, heads, dim;
  float scale;
  float* out;  // (S, T, H, D), contiguous
};

// A query's visible keys, in order.
struct Seen {
  const int64_t* key;  // n indices
  const float* bias;   // theirs
  int64_t n;
};

// A thread's buffers: per head its weights (padded: the exp reads whole vectors), largest
// weight, total and output sums.
struct Scratch {
  explicit Scratch(const Problem& p)
      : stride(p.keys + kLanes), weight(p.heads * stride), top(p.heads), total(p.heads),
        acc(p.heads * p.dim) {}
  int64_t stride;
  std::vector<float> weight, top, total, acc;
};

// Every head of one query, key by key: a key's heads sit side by side (one contiguous
// row in the cache), so the heads' loops go inside the keys' loop and each key is read
// once. Each head's sums still run over its keys in order, as the same IEEE operations:
// the bits do not depend on the loop order. C = the head dim's whole 16-lane chunks, known
// when compiled; the dims past them are summed after each chunk, one at a time.
template <int C>
INLINE void attend_query(const Problem& p, int64_t s, int64_t r, const float* q,
                         const Seen& seen, Scratch& w) {
  const int64_t dim = p.dim, heads = p.heads, rest = C * kLanes, stride = w.stride;
  const float* k0 = p.k + s * p.k_s;
  const float* v0 = p.v + s * p.v_s;
  float* weight = w.weight.data();  // (heads, stride)
  for (int64_t h = 0; h < heads; ++h) w.top[h] = kMasked;
  for (int64_t i = 0; i < seen.n; ++i) {
    const float* k = k0 + seen.key[i] * p.k_k;
    for (int64_t h = 0; h < heads; ++h) {
      const float *qh = q + h * dim, *kh = k + h * dim;
      v8f lo = {}, hi = {};
      UNROLLED
      for (int c = 0; c < C; ++c) {
        lo += load<v8f>(qh + kLanes * c) * load<v8f>(kh + kLanes * c);
        hi += load<v8f>(qh + kLanes * c + kHalf) * load<v8f>(kh + kLanes * c + kHalf);
      }
      float dot = sum(lo, hi);
      for (int64_t d = rest; d < dim; ++d) dot += qh[d] * kh[d];
      const float x = dot * p.scale + seen.bias[i];
      weight[h * stride + i] = x;
      w.top[h] = x > w.top[h] ? x : w.top[h];
    }
  }
  for (int64_t h = 0; h < heads; ++h) {
    float* wh = weight + h * stride;
    for (int64_t i = 0; i < seen.n; i += kHalf) store(wh + i, exp8(load<v8f>(wh + i) - w.top[h]));
    float total = 0.0f;
    for (int64_t i = 0; i < seen.n; ++i) total += wh[i];
    w.total[h] = total;
  }
  float* acc = w.acc.data();  // (heads, dim)
  std::fill(acc, acc + heads * dim, 0.0f);
  for (int64_t i = 0; i < seen.n; ++i) {
    const float* v = v0 + seen.key[i] * p.v_k;
    for (int64_t h = 0; h < heads; ++h) {
      const float wi = weight[h * stride + i];
      const float* vh = v + h * dim;
      float* ah = acc + h * dim;
      UNROLLED
      for (int c = 0; c < 2 * C; ++c)
        store(ah + kHalf * c, load<v8f>(ah + kHalf * c) + wi * load<v8f>(vh + kHalf * c));
      for (int64_t d = rest; d < dim; ++d) ah[d] += wi * vh[d];
    }
  }
  float* o = p.out + r * heads * dim;
  for (int64_t h = 0; h < heads; ++h) {
    const float* ah = acc + h * dim;
    UNROLLED
    for (int c = 0; c < 2 * C; ++c)
      store(o + h * dim + kHalf * c, load<v8f>(ah + kHalf * c) / w.total[h]);
    for (int64_t d = rest; d < dim; ++d) o[h * dim + d] = ah[d] / w.total[h];
  }
}

// Queries [begin, end) of the flattened (S, T).
CLONES void attend_queries(const Problem& p, int64_t begin, int64_t end) {
  std::vector<int64_t> key(p.keys);
  std::vector<float> bias(p.keys);
  Scratch w(p);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t s = r / p.t, t = r % p.t;
    const float* row = p.bias ? p.bias + s * p.b_s + t * p.b_t : nullptr;
    int64_t n = 0;
    for (int64_t j = 0; j < p.keys; ++j) {
      const float b = row ? row[j] : 0.0f;
      if (b == kMasked) continue;
      key[n] = j;
      bias[n++] = b;
    }
    if (n == 0) {  // as torch's SDPA: a query that sees nothing reads zeros
      std::fill(p.out + r * p.heads * p.dim, p.out + (r + 1) * p.heads * p.dim, 0.0f);
      continue;
    }
    const Seen seen{key.data(), bias.data(), n};
    const float* q = p.q + s * p.q_s + t * p.q_t;
    switch (p.dim / kLanes) {
      case 0: attend_query<0>(p, s, r, q, seen, w); break;
      case 1: attend_query<1>(p, s, r, q, seen, w); break;
      case 2: attend_query<2>(p, s, r, q, seen, w); break;
      case 3: attend_query<3>(p, s, r, q, seen, w); break;
      case 4: attend_query<4>(p, s, r, q, seen, w); break;
      case 5: attend_query<5>(p, s, r, q, seen, w); break;
      case 6: attend_query<6>(p, s, r, q, seen, w); break;
      case 7: attend_query<7>(p, s, r, q, seen, w); break;
      default: attend_query<kMaxChunks>(p, s, r, q, seen, w); break;
    }
  }
}

}  // namespace

Tensor ordered_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                         const MaybeTensor& bias) {
  const int64_t s = q.size(0), t = q.size(1), heads = q.size(2), dim = q.size(3);
  const int64_t keys = k.size(1);
  for (const Tensor* x : {&q, &k, &v}) {
    TORCH_CHECK(x->scalar_type() == at::kFloat && x->dim() == 4, "fp32 (S, ·, H, D) expected");
    TORCH_CHECK(x->stride(3) == 1 && x->stride(2) == dim, "heads must be contiguous");
  }
  const int64_t widest = kLanes * (kMaxChunks + 1) - 1;
  TORCH_CHECK(dim <= widest, "head dim ", dim, " above ", widest);
  Tensor out = at::empty({s, t, heads, dim}, q.options());
  Problem p{q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), nullptr,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), 0, 0,
            t, keys, heads, dim, static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim))),
            out.data_ptr<float>()};
  Tensor b;
  if (bias) {  // (T, K), (S, T, K) or (S, 1, T, K), each broadcastable
    TORCH_CHECK(bias->scalar_type() == at::kFloat, "an fp32 additive mask expected");
    b = bias->dim() == 4 ? bias->squeeze(1) : *bias;
    b = b.expand({s, t, keys});
    if (b.stride(2) != 1) b = b.contiguous();
    p.bias = b.data_ptr<float>();
    p.b_s = b.stride(0);
    p.b_t = b.stride(1);
  }
  at::parallel_for(0, s * t, 1, [&](int64_t begin, int64_t end) { attend_queries(p, begin, end); });
  return out.flatten(2);
}
