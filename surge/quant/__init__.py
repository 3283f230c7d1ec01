"""Quantization: FP8 (e4m3) weights and KV cache.

- :mod:`surge.quant.config`: the FP8 modes and their checks (pure Python);
- :mod:`surge.quant.fp8`: quantize / dequantize in torch, the reference of every FP8 kernel and
  the CPU emulation path of tests;
- :mod:`surge.quant.fp8_linear`: the FP8 linear method :mod:`surge.layers.linear` delegates to;
- :mod:`surge.quant.loading`: which layers are quantized, checkpoint scales, the post-load pass.

See ``docs/fp8.md``.
"""
