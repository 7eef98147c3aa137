// What a decoder call reads before its layers: the roots' slots of the slot table
// (specbeam/search/slots.py) and the embedded slots (tree_attention.py's embed_at). Between
// two decoder calls, whose products evict the interpreter's working set, each of their
// dozen small torch ops costs several microseconds; here they are one call each.
#include "native.h"

#include <algorithm>

Tensor add_roots(const Tensor& tokens, const Tensor& positions, const Tensor& hyp,
                 const Tensor& valid, const Tensor& visible, int64_t begin, const Tensor& roots,
                 const Tensor& lengths, const Tensor& starts) {
  // The table's (S, slots) tensors and visible (S, slots, slots), written in place from
  // slot `begin`; roots (S, n) tokens, lengths and starts (S,). Returns the roots' slots.
  const int64_t num_sources = roots.size(0), n = roots.size(1);
  TORCH_CHECK(tokens.is_contiguous() && positions.is_contiguous() && hyp.is_contiguous() &&
                  valid.is_contiguous() && visible.is_contiguous(),
              "add_roots: the slot table's tensors must be contiguous");
  TORCH_CHECK(begin + n <= tokens.size(1), "add_roots: the slot table is full");
  const Tensor root = roots.contiguous(), length = lengths.contiguous(), start = starts.contiguous();
  const int64_t slots = tokens.size(1);
  int64_t *tok = tokens.data_ptr<int64_t>(), *pos = positions.data_ptr<int64_t>();
  int64_t* own = hyp.data_ptr<int64_t>();
  bool *ok = valid.data_ptr<bool>(), *sees = visible.data_ptr<bool>();
  const int64_t *r = root.data_ptr<int64_t>(), *len = length.data_ptr<int64_t>();
  const int64_t* first = start.data_ptr<int64_t>();
  Tensor at = at::empty({num_sources, n}, roots.options());
  int64_t* out = at.data_ptr<int64_t>();
  for (int64_t s = 0; s < num_sources; ++s)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = begin + i, j = s * slots + slot;
      tok[j] = r[s * n + i];
      pos[j] = first[s] + len[s] - 1;
      own[j] = i;
      ok[j] = len[s] > 0;
      bool* row = sees + j * slots + begin;
      std::fill(row, row + n, false);
      row[i] = true;
      out[s * n + i] = slot;
    }
  return at;
}

Tensor embed(const Tensor& weight, const Tensor& tokens, const Tensor& positions,
             const Tensor& freqs, double scale, int64_t max_seq_len) {
  // fairseq2's embedding, scaled, plus sinusoidal positions (freqs row 1 + position), in
  // fp32: embed_at's ops in its order, so the same roundings.
  if (weight.scalar_type() == at::kFloat && freqs.scalar_type() == at::kFloat &&
      weight.is_contiguous() && freqs.is_contiguous()) {  // the same roundings, by one loop
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
