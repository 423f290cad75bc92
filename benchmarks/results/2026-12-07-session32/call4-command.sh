# session 32, call 4 (prepared, NOT RUN: no device time left): compute-sanitizer memcheck over the block-scaled FP8 tests (every tile forced at
# M = 7 and 255, guarded outputs; device time allowed no more) and
# the gated RMSNorm tests (sm_90a now 8 heads a program)
set -x
O=$OUT; R=$O/r; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
OUT=$O/t MEMCHECK_TIMEOUT=150 MEMCHECK_TESTS="tests/gpu/test_gpu_gemm_fp8.py tests/gpu/test_gpu_norm.py" \
  KEXPR="(block_matches and ([7- or [255-)) or gated" timeout 210 bash tools/gpu/run.sh memcheck > $R/memcheck.txt 2>&1
tail -5 $R/memcheck.txt; cp $O/t/memcheck.log $R/; rm -rf $O/t; tar -czf $O/call4.tgz -C $O r; rm -rf $R
