# session 32, call 3: the adopted tree (block-FP8 192x128 tile with three math warp groups, unordered; refitted
# tile factors; sm_90a's gated RMSNorm at 8 heads a program / 4 warps): GPU tests of what changed, bench_norm and
# bench_gemm_fp8 (default M list) for BENCHMARKS.md
set -x
O=$OUT; R=$O/r; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
OUT=$O/t TEST_TIMEOUT=330 timeout 400 bash tools/gpu/run.sh tests "norm or gemm_fp8 or engine or capture or bounds" > $R/tests.txt 2>&1; tail -4 $R/tests.txt
cp $O/t/gpu-tests.log $R/gpu-tests.log; cp $O/t/results.json $R/test-results.json; rm -rf $O/t
tar -czf $O/call3.tgz -C $O r
export TRITON_INTERPRET=0
P="env PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site"
$P timeout 120 python3 benchmarks/bench_norm.py $R/norm.json > $R/norm.log 2>&1; grep -i gated $R/norm.log | head
tar -czf $O/call3.tgz -C $O r
$P timeout 200 python3 benchmarks/bench_gemm_fp8.py $R/gemm_fp8.json > $R/gemm_fp8.log 2>&1; grep -E "^M=" $R/gemm_fp8.log | tail -30
tar -czf $O/call3.tgz -C $O r; rm -rf $R
