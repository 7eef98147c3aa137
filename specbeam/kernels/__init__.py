"""The CPU inference engine below the search: the CPU's features (`cpu`), a call's runtime
settings (`runtime`), products on oneDNN, MKL and the few-row kernel (`onednn`), quantized
copies (`quant`), ordered attention (`attention`), the compiled extension (`native`, loader;
`native_layers`, a decoder's layers in one call; `csrc/`), the attention states those layers
write (`states`) and the lean decoder and encoder (`lean_decoder`, `lean_encoder`). Nothing
here imports `specbeam.search`."""
