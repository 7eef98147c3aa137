// A decoder call's embedded slots (tree_attention.py's embed_at) in one call: between two
// decoder calls, whose products evict the interpreter's working set, each of its half
// dozen small torch ops costs several microseconds.
#include "native.h"

#include <algorithm>

Tensor embed(const Tensor& weight, const Tensor& tokens, const Tensor& positions,
             const Tensor& freqs, double scale, int64_t max_seq_len) {
  // fairseq2's embedding, scaled, plus sinusoidal positions (freqs row 1 + position). fp32
  // weights: one loop doing embed_at's ops in its order, so the same roundings.
  if (weight.scalar_type() == at::kFloat && freqs.scalar_type() == at::kFloat &&
      weight.is_contiguous() && freqs.is_contiguous()) {
    const Tensor tok = tokens.contiguous(), pos = positions.contiguous();
    const int64_t dim = weight.size(1), n = tok.numel(), rows = weight.size(0);
    std::vector<int64_t> sizes = tok.sizes().vec();
    sizes.push_back(dim);
    Tensor out = at::empty(sizes, weight.options());
    const float *w = weight.data_ptr<float>(), *f = freqs.data_ptr<float>();
    const int64_t *t = tok.data_ptr<int64_t>(), *p = pos.data_ptr<int64_t>();
    const float factor = static_cast<float>(scale);
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK(t[i] >= 0 && t[i] < rows, "embed: token ", t[i], " outside the vocabulary");
      const float* e = w + t[i] * dim;
      const float* at = f + (std::clamp<int64_t>(p[i], 0, max_seq_len - 1) + 1) * dim;
      for (int64_t d = 0; d < dim; ++d)
        o[i * dim + d] = (scale != 1.0 ? e[d] * factor : e[d]) + at[d];
    }
    return out;
  }
  Tensor x = at::embedding(weight, tokens);
  if (scale != 1.0) x = x * scale;
  Tensor rows = positions.clamp(0, max_seq_len - 1) + 1;
  return x.to(at::kFloat) + at::index_select(freqs, 0, rows.flatten()).view(x.sizes());
}
