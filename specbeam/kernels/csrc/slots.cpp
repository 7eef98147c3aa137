// The slot table (specbeam/search/slots.py), a draft tree's place in it (tree.py,
// DraftTree.add_to) and the verified paths read from it (verify.py) in C++: the same writes
// and reads, as loops over a few dozen slots instead of ~10-20 torch ops per chain block,
// tree level or path, each of which costs several microseconds between two decoder calls.
#include "native.h"

#include <algorithm>

namespace {

// A slot table's tensors, written in place: tokens, positions, hyp, valid (S, slots) and
// visible (S, slots, slots).
struct Table {
  int64_t *tokens, *positions, *hyp;
  bool *valid, *visible;
  int64_t num_sources, slots;

  explicit Table(const std::vector<Tensor>& t)
      : tokens(t.at(0).data_ptr<int64_t>()),
        positions(t.at(1).data_ptr<int64_t>()),
        hyp(t.at(2).data_ptr<int64_t>()),
        valid(t.at(3).data_ptr<bool>()),
        visible(t.at(4).data_ptr<bool>()),
        num_sources(t.at(0).size(0)),
        slots(t.at(0).size(1)) {
    for (const Tensor& x : t) TORCH_CHECK(x.is_contiguous(), "slot table tensors must be contiguous");
  }

  bool* sees(int64_t s, int64_t slot) const { return visible + (s * slots + slot) * slots; }

  // One block of w children below `parents` (slot indices), from slot `begin`; source s's
  // tokens and valid flags start at s · stride, its parents at s · parent_stride.
  void add_nodes(int64_t begin, int64_t w, const int64_t* node_tokens, const bool* node_valid,
                 int64_t stride, const int64_t* parents, int64_t parent_stride) {
    TORCH_CHECK(begin + w <= slots, "the slot table is full");
    for (int64_t s = 0; s < num_sources; ++s)
      for (int64_t b = 0; b < w; ++b) {
        const int64_t slot = begin + b, j = s * slots + slot, p = parents[s * parent_stride + b];
        TORCH_CHECK(p >= 0 && p < begin, "a node's parent must be an earlier slot");
        tokens[j] = node_tokens[s * stride + b];
        positions[j] = positions[s * slots + p] + 1;
        hyp[j] = hyp[s * slots + p];
        valid[j] = node_valid[s * stride + b] && valid[s * slots + p];
        std::copy_n(sees(s, p), slots, sees(s, slot));
        sees(s, slot)[slot] = true;
      }
  }
};

}  // namespace

Tensor add_chains(const std::vector<Tensor>& table, int64_t begin, const Tensor& chains,
                  const Tensor& lengths, const Tensor& starts) {
  // chains (S, n, c) right-aligned, the last `lengths[s]` links valid, the first of them
  // at position starts[s]; hypothesis i's links at slots begin + i·c …, each seeing the
  // valid links of its own chain up to itself (padding sees itself only). Returns the
  // roots' slots (S, n).
  Table t(table);
  const Tensor chain = chains.contiguous(), length = lengths.contiguous(), start = starts.contiguous();
  const int64_t n = chain.size(1), c = chain.size(2);
  TORCH_CHECK(begin + n * c <= t.slots, "the slot table is full");
  const int64_t *tok = chain.data_ptr<int64_t>(), *len = length.data_ptr<int64_t>();
  const int64_t* first = start.data_ptr<int64_t>();
  Tensor roots = at::empty({t.num_sources, n}, chains.options());
  int64_t* root = roots.data_ptr<int64_t>();
  for (int64_t s = 0; s < t.num_sources; ++s)
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t l = 0; l < c; ++l) {
        const int64_t slot = begin + i * c + l, j = s * t.slots + slot;
        const bool ok = l >= c - len[s];
        t.tokens[j] = tok[(s * n + i) * c + l];
        t.positions[j] = first[s] + l - (c - len[s]);
        t.hyp[j] = i;
        t.valid[j] = ok;
        bool* row = t.sees(s, slot) + begin;
        std::fill(row, row + n * c, false);
        for (int64_t m = 0; m <= l; ++m) row[i * c + m] = m >= c - len[s];
        row[i * c + l] = true;
      }
      root[s * n + i] = begin + i * c + c - 1;
    }
  return roots;
}

Tensor add_nodes(const std::vector<Tensor>& table, int64_t begin, const Tensor& tokens,
                 const Tensor& parents, const Tensor& valid) {
  // One block of children, tokens, parents (slots) and valid (S, w). Returns their slots.
  Table t(table);
  const Tensor tok = tokens.contiguous(), par = parents.contiguous(), ok = valid.contiguous();
  const int64_t w = tok.size(1);
  t.add_nodes(begin, w, tok.data_ptr<int64_t>(), ok.data_ptr<bool>(), w, par.data_ptr<int64_t>(), w);
  return at::arange(begin, begin + w, tokens.options()).expand({t.num_sources, w});
}

std::tuple<Tensor, int64_t> add_tree(const std::vector<Tensor>& table, int64_t begin,
                                     const Tensor& root_slots, const Tensor& tokens,
                                     const Tensor& parents, const Tensor& valid) {
  // A draft tree (S, D, w) below the roots' slots (S, n), level by level: DraftTree.add_to.
  // A level's columns no source uses are left out; those nodes keep slot 0. Returns the
  // nodes' slots (S, D, w) and the table's new size.
  Table t(table);
  const Tensor tok = tokens.contiguous(), par = parents.contiguous(), ok = valid.contiguous();
  const Tensor roots = root_slots.contiguous();
  const int64_t depth = tok.size(1), w = tok.size(2), n = roots.size(1);
  Tensor node_slots = at::zeros({t.num_sources, depth, w}, root_slots.options());
  int64_t* out = node_slots.data_ptr<int64_t>();
  const int64_t *p = par.data_ptr<int64_t>(), *r = roots.data_ptr<int64_t>();
  const bool* v = ok.data_ptr<bool>();
  std::vector<int64_t> parent_slots(t.num_sources * w);
  int64_t size = begin;
  for (int64_t d = 0; d < depth; ++d) {
    int64_t used = 0;
    for (int64_t s = 0; s < t.num_sources; ++s)
      for (int64_t b = 0; b < w; ++b)
        if (v[(s * depth + d) * w + b]) used = std::max(used, b + 1);
    if (used == 0) break;
    // parent_slots as tree.py gathers them: the roots (index clamped to n - 1) at the
    // first level, the previous level's slots (width w, 0 past its used columns) below.
    for (int64_t s = 0; s < t.num_sources; ++s)
      for (int64_t b = 0; b < used; ++b) {
        const int64_t at = p[(s * depth + d) * w + b];
        TORCH_CHECK(at >= 0, "a node's parent index must be ≥ 0");
        parent_slots[s * w + b] = d == 0 ? r[s * n + std::min(at, n - 1)]
                                         : out[(s * depth + d - 1) * w + std::min(at, w - 1)];
      }
    t.add_nodes(size, used, tok.data_ptr<int64_t>() + d * w, v + d * w, depth * w,
                parent_slots.data(), w);
    for (int64_t s = 0; s < t.num_sources; ++s)
      for (int64_t b = 0; b < used; ++b) out[(s * depth + d) * w + b] = size + b;
    size += used;
  }
  return {node_slots, size};
}

Tensor path_slots(const Tensor& visible_in, int64_t size, const Tensor& slot_in) {
  // Each (s, i)'s slots visible from slot[s, i] (S, k) among the first `size`, ascending
  // and right-aligned in (S, k, L), L the longest such path, -1 before: Verification.path_slots.
  const Tensor visible = visible_in.contiguous(), slot = slot_in.contiguous();
  const int64_t num_sources = slot.size(0), k = slot.size(1), slots = visible.size(1);
  TORCH_CHECK(size <= visible.size(2), "path_slots: size beyond the table");
  const bool* v = visible.data_ptr<bool>();
  const int64_t* at = slot.data_ptr<int64_t>();
  int64_t longest = 0;
  std::vector<int64_t> count(num_sources * k, 0);
  std::vector<const bool*> rows(num_sources * k);
  for (int64_t j = 0; j < num_sources * k; ++j) {
    TORCH_CHECK(at[j] >= 0 && at[j] < slots, "path_slots: slot ", at[j], " outside the table");
    rows[j] = v + ((j / k) * slots + at[j]) * visible.size(2);
    count[j] = std::count(rows[j], rows[j] + size, true);
    longest = std::max(longest, count[j]);
  }
  Tensor out = at::full({num_sources, k, longest}, -1, slot.options());
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t j = 0; j < num_sources * k; ++j) {
    int64_t* to = o + j * longest + (longest - count[j]);
    for (int64_t b = 0; b < size; ++b)
      if (rows[j][b]) *to++ = b;
  }
  return out;
}
