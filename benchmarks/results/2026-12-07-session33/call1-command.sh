# session 33, call 1: compute-sanitizer memcheck (session 32's prepared call 4, widened): the block-scaled FP8 tests
# with every tile forced (192x128 included) at M = 7 / 255 / 2048 into guarded outputs, the odd legal shapes, the
# block launcher's refusals, and the gated RMSNorm tests (sm_90a now 8 heads a program)
set -x
O=$OUT; R=$O/r; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
OUT=$O/t MEMCHECK_TIMEOUT=500 MEMCHECK_TESTS="tests/gpu/test_gpu_gemm_fp8.py tests/gpu/test_gpu_norm.py" \
  KEXPR="(block_matches and ([7- or [255- or [2048-)) or odd_legal or block_launcher or gated" timeout 570 bash tools/gpu/run.sh memcheck > $R/memcheck.txt 2>&1
tail -5 $R/memcheck.txt; cp $O/t/memcheck.log $R/; rm -rf $O/t; tar -czf $O/call1.tgz -C $O r; rm -rf $R
