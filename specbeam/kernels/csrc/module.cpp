// The extension's Python bindings: the lean decoder's layers (lean_layers.cpp), the
// lean layers' attention (attention.cpp), fp32 products over a few rows (few_rows.cpp), int8
// sums on fbgemm (int8_sums.cpp), acceptance's replay (accept.cpp) and its candidates
// (top.cpp), the cache's commit (cache.cpp), the slot table (slots.cpp) and a call's embedded
// slots (embed.cpp).
#include "native.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode", &decode, "a pre-LN decoder's layers over one call's slots");
  m.def("ordered_attention", &ordered_attention,
        "attention summing each query's visible keys in key order, alone");
  m.def("few_rows_product", &few_rows_product, "x @ w^T + b over 1 to 8 rows of fp32");
  m.def("int8_product", &int8_product, "quant.int8_product's ops, on _int_mm or fbgemm");
  m.def("int8_pack", &int8_pack, "fbgemm's packed copy of an int8 weight (out, in)");
  m.def("int8_sums", &int8_sums, "int8 × int8 sums over fbgemm's packed copy, exact");
  m.def("tree_bias", &tree_bias, "the additive self-attention mask of a tree call");
  m.def("accept", &accept, "acceptance (exact or relaxed) over a verified draft tree");
  m.def("top_candidates", &top_candidates, "a beam step's best candidates where unambiguous");
  m.def("add_chains", &add_chains, "the slot table's pending chains");
  m.def("add_nodes", &add_nodes, "a block of nodes in the slot table");
  m.def("add_tree", &add_tree, "a draft tree's nodes in the slot table");
  m.def("path_slots", &path_slots, "the slots on each hypothesis' verified path");
  m.def("embed", &embed, "token embeddings scaled, plus sinusoidal positions");
  m.def("commit", &commit, "the speculative cache's commit of the kept slots");
  m.attr("TENSORS_PER_LAYER") = kTensorsPerLayer;
  m.attr("INTS_PER_LAYER") = kIntsPerLayer;
}
