// The speculative cache's commit (specbeam/search/cache.py, SpeculativeKVCache.commit) in
// C++: the torch path's gathers, cumsum and index_put are ~25 ops a pass on tensors of a
// few hundred entries, each costing more than the copy it does. Here every kept slot's
// keys and values are one row copy, of whatever dtype the cache holds.
#include "native.h"

#include <ATen/Parallel.h>

#include <cstring>

namespace {

// The kept slots of new hypothesis i of source s, in slot order: from a mask
// (S, k, spec) or one slot each (S, k).
std::vector<std::vector<int64_t>> kept_slots(const Tensor& keep, int64_t num_sources, int64_t k) {
  std::vector<std::vector<int64_t>> kept(num_sources * k);
  if (keep.dim() == 2) {
    Tensor slot = keep.to(at::kLong).contiguous();
    const int64_t* p = slot.data_ptr<int64_t>();
    for (int64_t j = 0; j < num_sources * k; ++j) kept[j].push_back(p[j]);
    return kept;
  }
  Tensor mask = keep.to(at::kBool).contiguous();
  const int64_t spec = mask.size(2);
  const bool* p = mask.data_ptr<bool>();
  for (int64_t j = 0; j < num_sources * k; ++j)
    for (int64_t t = 0; t < spec; ++t)
      if (p[j * spec + t]) kept[j].push_back(t);
  return kept;
}

}  // namespace

std::vector<Tensor> commit(const Tensor& buf, const Tensor& columns_in, const Tensor& lens_in,
                           int64_t width, const Tensor& origin_in, const Tensor& keep) {
  // buf (layers, 2, S, C, k, H, D), each (H, D) row contiguous; columns (S, k, C).
  TORCH_CHECK(buf.dim() == 7 && buf.stride(6) == 1 && buf.stride(5) == buf.size(6) &&
                  buf.stride(3) == buf.size(4) * buf.stride(4),
              "commit: the cache buffer's (C, k, H, D) block must be contiguous");
  const int64_t parts = buf.size(0) * 2, num_sources = buf.size(2), capacity = buf.size(3);
  const int64_t k = buf.size(4);
  const int64_t elem = buf.element_size(), row_bytes = buf.size(5) * buf.size(6) * elem;
  Tensor lens = lens_in.contiguous(), origin = origin_in.to(at::kLong).contiguous();
  Tensor columns = columns_in.contiguous();
  TORCH_CHECK(lens.size(0) == num_sources && origin.size(0) == num_sources &&
                  origin.size(1) == k && keep.size(0) == num_sources && keep.size(1) == k,
              "commit: origin and keep must be (S, k) for the cache's S sources");
  const std::vector<std::vector<int64_t>> kept = kept_slots(keep, num_sources, k);
  const int64_t *len = lens.data_ptr<int64_t>(), *orig = origin.data_ptr<int64_t>();
  Tensor new_lens = at::empty_like(lens);
  int64_t* new_len = new_lens.data_ptr<int64_t>();
  for (int64_t s = 0; s < num_sources; ++s) {
    const size_t n = kept[s * k].size();
    for (int64_t i = 1; i < k; ++i)
      TORCH_CHECK(kept[s * k + i].size() == n,
                  "commit: every hypothesis of a source keeps the same number of slots");
    for (int64_t i = 0; i < k; ++i) {
      const int64_t o = orig[s * k + i];
      TORCH_CHECK(o >= 0 && o < k, "commit: origin ", o, " is not a hypothesis");
      for (const int64_t slot : kept[s * k + i])
        TORCH_CHECK(slot >= 0 && width * k + slot < capacity * k, "commit: slot ", slot,
                    " is outside the cache");
    }
    new_len[s] = len[s] + static_cast<int64_t>(n);
    TORCH_CHECK(new_len[s] <= capacity, "commit: the cache has no room for the kept slots");
  }
  // A part is one layer's keys or values. A kept slot is read before anything is written:
  // the positions a source writes may hold the speculative slots it reads.
  char* base = static_cast<char*>(buf.data_ptr());
  const int64_t part_stride = buf.stride(1) * elem, s_stride = buf.stride(2) * elem;
  const int64_t pos_stride = buf.stride(3) * elem, hyp_stride = buf.stride(4) * elem;
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    std::vector<char> rows;
    for (int64_t part = begin; part < end; ++part) {
      // (layer, K/V) = (part / 2, part % 2): the buffer's first two dimensions.
      char* p = base + (part / 2) * buf.stride(0) * elem + (part % 2) * part_stride;
      for (int64_t s = 0; s < num_sources; ++s) {
        char* src = p + s * s_stride;
        const size_t n = kept[s * k].size();
        rows.resize(k * n * row_bytes);
        for (int64_t i = 0; i < k; ++i)
          for (size_t r = 0; r < n; ++r) {
            const int64_t key = width * k + kept[s * k + i][r];
            std::memcpy(rows.data() + (i * n + r) * row_bytes,
                        src + (key / k) * pos_stride + (key % k) * hyp_stride, row_bytes);
          }
        for (int64_t i = 0; i < k; ++i)
          for (size_t r = 0; r < n; ++r)
            std::memcpy(src + (len[s] + r) * pos_stride + i * hyp_stride,
                        rows.data() + (i * n + r) * row_bytes, row_bytes);
      }
    }
  });
  // Hypothesis i takes its origin's column map, and its own column from the prefix's end.
  const int64_t width_c = columns.size(2);
  Tensor new_columns = at::empty_like(columns);
  const int64_t* col = columns.data_ptr<int64_t>();
  int64_t* out = new_columns.data_ptr<int64_t>();
  for (int64_t s = 0; s < num_sources; ++s)
    for (int64_t i = 0; i < k; ++i) {
      const int64_t* from = col + (s * k + orig[s * k + i]) * width_c;
      int64_t* to = out + (s * k + i) * width_c;
      const int64_t prefix = std::min(len[s], width_c);
      std::copy(from, from + prefix, to);
      std::fill(to + prefix, to + width_c, i);
    }
  return {new_columns, new_lens};
}
