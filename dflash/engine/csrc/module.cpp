// The kernel module: the three kernel files compiled as one translation unit (torch's
// headers are parsed once, not three times: the build takes a third less) and their Python
// bindings. dflash.engine.kernels builds this file once per instruction set (vec.h).
#include <torch/csrc/utils/pybind.h>  // at::Tensor arguments; torch/extension.h takes twice as long to compile

#include "decode_attention.cpp"
#include "layer_ops.cpp"
#include "small_gemm.cpp"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("isa") = dflash_vec::ISA;
  pybind11::dict tiles;  // output columns per packed tile, by the weight's dtype
  tiles["float32"] = F32::TILE;
  tiles["bfloat16"] = BF16::TILE;
  m.attr("tile_columns") = tiles;
  m.def("small_linear", &small_linear, "x @ w.T (+ bias) for a few rows of x, from a packed weight");
  m.def("decode_attention", &decode_attention, "softmax(q k^T scale + mask) v for a few query positions (GQA)");
  m.def("rms_norm", &rms_norm, "HF's RMSNorm of rows, after an optional residual add");
  m.def("silu_mul", &silu_mul, "silu(gate) * up of fused gate_up rows");
  m.def("norm_rope", &norm_rope, "HF's RMSNorm of each head (optional), then the rotary embedding");
  m.def("argmax_rows", &argmax_rows, "x.argmax(-1) of contiguous rows");
  m.def("rope_into_cache", &rope_into_cache, "rotary query and keys, keys and values into a layer's cache");
}
