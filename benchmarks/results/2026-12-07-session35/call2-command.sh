# session 35, call 2: the FP8 M = 1 GEMV with per-step sums (kernels_src/gemv/gemv.py; sm_90a cubins byte-identical
# to session 34's variant C) and the rule's new M = 1 FP8 tile order (n4.k1024 first, no x re-read cost: ops/gemv.py
# M1_L2_COST). HEAD = this tree; root OH = the two cubins and manifest of the commit before (3c3be13), same runtime.
# Tests (FP8 GEMV, FP8 engine), bench_gemv `1 w8a16` with every forced alternative (sweep to 2 GB), the 35B-A3B and
# 27B FP8 engines at B = 1 for HEAD / OH alternating, memcheck over the FP8 MoE decode kernels' bad-id tests (all
# five tiles: call 1's whole-file run ran out of memory under the sanitizer after tiles 0-1).
set -x
SECONDS=0
O=$OUT; R=/tmp/r; mkdir -p $R
snap() { tar -czf $O/call2.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
OUT=/tmp/b timeout 150 bash tools/gpu/run.sh build-only > $R/build.txt 2>&1
echo "build done at $SECONDS" >> $R/times.txt; snap
export PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site TRITON_INTERPRET=0
mkdir -p build/var && tar -xzf build/carry/gemv-oh.tgz -C build/var && cp -rn vendored/sm_90a/. build/var/OH/vendored/sm_90a/
cp manifests/schema.json build/var/OH/manifests/
timeout 120 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" tests/gpu/test_gpu_gemv_w8a16.py \
  tests/gpu/test_gpu_engine_fp8.py tests/gpu/test_gpu_gemv.py > $R/tests.txt 2>&1
echo "tests done at $SECONDS" >> $R/times.txt; snap
BENCH_GEMV_SWEEP_MAX_BYTES=2e9 timeout 90 python3 benchmarks/bench_gemv.py $R/gemv-head.json 1 w8a16 > $R/gemv-head.txt 2>&1
echo "gemv done at $SECONDS" >> $R/times.txt; snap
for i in 1 2; do
  for v in head OH; do
    [ $v = OH ] && r="VKC_ARTIFACT_ROOT=$PWD/build/var/OH" || r="VKC_BENCH=1"
    env $r timeout 50 python3 benchmarks/bench_engine.py --shape 35b-a3b --quant fp8 --batches 1 --prefill 64 \
      --long-prefill 0 --steps 32 --timeline --out $R/engine35-$v-$i.json > $R/engine35-$v-$i.txt 2>&1; snap
  done
done
echo "engine35 done at $SECONDS" >> $R/times.txt
for v in head OH; do
  [ $SECONDS -gt 330 ] && break
  [ $v = OH ] && r="VKC_ARTIFACT_ROOT=$PWD/build/var/OH" || r="VKC_BENCH=1"
  env $r timeout 80 python3 benchmarks/bench_engine.py --shape 27b --quant fp8 --batches 1 --prefill 64 \
    --long-prefill 0 --steps 32 --timeline --out $R/engine27-$v.json > $R/engine27-$v.txt 2>&1; snap
done
echo "engine27 done at $SECONDS" >> $R/times.txt; snap
if [ $SECONDS -lt 430 ]; then
  VKC_REUSE_BUILD=1 OUT=/tmp/m MEMCHECK_TIMEOUT=110 MEMCHECK_TESTS=tests/gpu/test_gpu_moe_quant.py \
    timeout 120 bash tools/gpu/run.sh memcheck "bad_ids and fp8" > $R/memcheck.txt 2>&1; cp /tmp/m/memcheck.log $R/ 2>/dev/null
fi
echo "all done at $SECONDS" >> $R/times.txt
snap
