# RUN in session 35 as its call 1 (this file unchanged but this line), at 3c3be13, H100: results in ../2026-12-07-session35/call1.tgz. The memcheck's -k filter did not apply (run.sh read KEXPR only from its second argument then).
# session 34, call 2 (the budget left ~300 s: memcheck first, then the engine and the tiles; the tests of the MoE
# kernels ran in call 1 on the same cubins): the landed MoE FP8 decode kernels (x / h in the weight tile's layout; gate_up's pick n8.k512):
# GPU tests (FP8 MoE, FP8 engine, FP8 GEMV, bf16 MoE decode), the 35B-A3B FP8 engine at B = 1, bench_moe fp8 at
# M = 1, 2, 4 (every decode tile forced), memcheck over the FP8 decode kernels' bad-id tests; then the FP8 M = 1
# GEMV with per-step sums (call 1's C, root C2 = HEAD + C's two cubins) against HEAD's: bench_gemv `1 w8a16` with the
# forced alternatives of the shapes up to 100 MB, and the engine; the FP8 GEMV GPU tests on C2.
set -x
SECONDS=0
O=$OUT; R=/tmp/r; mkdir -p $R
snap() { tar -czf $O/call2.tgz -C /tmp r; }  # after each step: a call cut short by the budget keeps what ran
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
OUT=/tmp/b timeout 150 bash tools/gpu/run.sh build-only > $R/build.txt 2>&1
echo "build done at $SECONDS" >> $R/times.txt; snap
export PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site TRITON_INTERPRET=0
if [ $SECONDS -lt 100 ]; then
  VKC_REUSE_BUILD=1 OUT=/tmp/m MEMCHECK_TIMEOUT=100 MEMCHECK_TESTS=tests/gpu/test_gpu_moe_quant.py KEXPR="bad_ids and fp8" \
    timeout 110 bash tools/gpu/run.sh memcheck > $R/memcheck.txt 2>&1; cp /tmp/m/memcheck.log $R/ 2>/dev/null
fi
echo "memcheck done at $SECONDS" >> $R/times.txt; snap
timeout 50 python3 benchmarks/bench_engine.py --shape 35b-a3b --quant fp8 --batches 1 --prefill 64 --long-prefill 0 \
  --steps 32 --timeline --out $R/engine-fp8-head.json > $R/engine-fp8-head.txt 2>&1
VKC_BENCH_MS=1,2,4 timeout 60 python3 benchmarks/bench_moe.py $R/moe-fp8.json fp8 > $R/moe-fp8.txt 2>&1
echo "bench done at $SECONDS" >> $R/times.txt; snap
timeout 150 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" tests/gpu/test_gpu_moe_quant.py \
  tests/gpu/test_gpu_engine_fp8.py tests/gpu/test_gpu_gemv_w8a16.py tests/gpu/test_gpu_moe_decode.py > $R/tests.txt 2>&1
echo "tests done at $SECONDS" >> $R/times.txt; snap
mkdir -p build/var && tar -xzf build/carry/gemv-c2.tgz -C build/var
mkdir -p build/var/C2/vendored/sm_90a && cp -rn vendored/sm_90a/. build/var/C2/vendored/sm_90a/
cp manifests/schema.json build/var/C2/manifests/
VKC_ARTIFACT_ROOT=$PWD/build/var/C2 timeout 60 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" \
  tests/gpu/test_gpu_gemv_w8a16.py > $R/tests-C2.txt 2>&1; snap
for v in C2 head; do
  [ $SECONDS -gt 420 ] && break
  [ $v = C2 ] && r="VKC_ARTIFACT_ROOT=$PWD/build/var/C2" || r="VKC_BENCH=1"
  env $r BENCH_GEMV_SWEEP_MAX_BYTES=100e6 timeout 60 python3 benchmarks/bench_gemv.py $R/gemv-$v-$SECONDS.json 1 w8a16 > $R/gemv-$v-$SECONDS.txt 2>&1; snap
  [ $SECONDS -gt 480 ] && break
  env $r timeout 50 python3 benchmarks/bench_engine.py --shape 35b-a3b --quant fp8 --batches 1 --prefill 64 \
    --long-prefill 0 --steps 32 --timeline --out $R/engine-fp8-$v-$SECONDS.json > $R/engine-fp8-$v-$SECONDS.txt 2>&1; snap
done
echo "all done at $SECONDS" >> $R/times.txt
snap
