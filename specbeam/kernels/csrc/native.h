// The extension's functions, declared once: defined in lean_layers.cpp, attention.cpp,
// few_rows.cpp, int8_sums.cpp, accept.cpp, top.cpp, cache.cpp, slots.cpp and embed.cpp,
// bound in module.cpp.
#pragma once

#include <torch/extension.h>

#include <optional>
#include <vector>

using torch::Tensor;
using MaybeTensor = std::optional<Tensor>;

// Per layer, the tensors and ints `decode` reads (lean_layers.cpp says which).
extern const size_t kTensorsPerLayer, kIntsPerLayer;

std::vector<Tensor> decode(Tensor x, const std::vector<MaybeTensor>& tensors,
                           const std::vector<int64_t>& ints, const std::vector<double>& eps,
                           int64_t num_layers, int64_t start, const Tensor& self_bias,
                           const MaybeTensor& cross_bias, const MaybeTensor& pack_index,
                           const std::vector<int64_t>& taps);
Tensor ordered_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                         const MaybeTensor& bias);
Tensor few_rows_product(const Tensor& x, const Tensor& w, const MaybeTensor& b);
Tensor int8_product(const Tensor& x, bool fbgemm, const Tensor& q, const Tensor& scales,
                    const MaybeTensor& b);
Tensor int8_pack(const Tensor& q);
Tensor int8_sums(const Tensor& qx, const Tensor& handle);
Tensor tree_bias(const Tensor& lens, int64_t k, const Tensor& column, const Tensor& visible,
                 c10::ScalarType dtype);
std::vector<Tensor> accept(const Tensor& logits_in, const Tensor& root_slots,
                           const Tensor& node_slots, const Tensor& tokens_in,
                           const Tensor& parents_in, const Tensor& valid_in,
                           const Tensor& positions, const Tensor& scores_in, const Tensor& seqs,
                           const Tensor& step_scores, const Tensor& step_nr_in,
                           const Tensor& finished, int64_t k, const std::vector<int64_t>& ints,
                           const std::vector<double>& doubles, bool bounded);
std::vector<Tensor> commit(const Tensor& buf, const Tensor& columns, const Tensor& lens,
                           int64_t width, const Tensor& origin, const Tensor& keep);
// The m best of base[r] + lprobs[r * vocab + t] over rows × vocab candidates, descending,
// where they are unambiguous (top.cpp); false leaves them to ATen's topk.
bool top_distinct(const float* base, const float* lprobs, int64_t rows, int64_t vocab, int64_t m,
                  float* values, int64_t* indices);
std::vector<Tensor> top_candidates(const Tensor& base, const Tensor& lprobs, int64_t m);
Tensor add_chains(const std::vector<Tensor>& table, int64_t begin, const Tensor& chains,
                  const Tensor& lengths, const Tensor& starts);
Tensor add_nodes(const std::vector<Tensor>& table, int64_t begin, const Tensor& tokens,
                 const Tensor& parents, const Tensor& valid);
std::tuple<Tensor, int64_t> add_tree(const std::vector<Tensor>& table, int64_t begin,
                                     const Tensor& root_slots, const Tensor& tokens,
                                     const Tensor& parents, const Tensor& valid);
Tensor embed(const Tensor& weight, const Tensor& tokens, const Tensor& positions,
             const Tensor& freqs, double scale, int64_t max_seq_len);
Tensor path_slots(const Tensor& visible, int64_t size, const Tensor& slot);
