"""FP8 e4m3 W8A8 GEMMs (per-tensor, per-token x per-channel, block-wise 128x128) and bf16 -> fp8 activation
quantizers, Triton (the CuTe DSL FP8 GEMM lives in family gemm)."""
