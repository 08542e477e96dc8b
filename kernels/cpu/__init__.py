"""The CPU kernels: C for x86 (AVX2 + FMA + F16C everywhere, AVX-512 BF16 and VNNI paths where the CPU has
them), built on first use and called through ctypes.

- build.py: compiles the C sources beside it into one cached shared library and loads it (None where they
  cannot run: the callers' torch paths run instead).
- ops.py: the face of the 16-bit kernels (gemm16, paged attention, the fused decode step, RMSNorm, SiLU-and-
  mul, RoPE, the sampler's draw); kernels.h, gemm.c, attention.c, decode.c, elementwise.c.
- quant.py: the face of the GGUF-quantized kernels (repacked 16-row tiles, 8-bit activations, integer dot
  products); quant.h, quant.c, quant_pack.c.
"""
