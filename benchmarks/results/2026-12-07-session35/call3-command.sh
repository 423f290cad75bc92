# session 35, call 3: the bf16 M = 1 GEMV (gemv_bf16_m1_kernel) with per-step sums, as the FP8 one now has: roots
# BS (per-step sums, weight tile one step ahead kept) and BN (per-step sums, no tile ahead), built by variants.py;
# head = the tree at 7b8e145 (+ this script). GPU tests of the gemv family on each root, bench_gemv `1 bf16`
# (forced alternatives), the 35B-A3B bf16 engine at B = 1 (40 M = 1 calls of [2048, 4096] a step), alternating.
set -x
SECONDS=0
O=$OUT; R=/tmp/r; mkdir -p $R
snap() { tar -czf $O/call3.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
OUT=/tmp/b timeout 150 bash tools/gpu/run.sh build-only > $R/build.txt 2>&1
echo "build done at $SECONDS" >> $R/times.txt; snap
export PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site TRITON_INTERPRET=0
mkdir -p build/var && tar -xzf build/carry/gemv-bf16-var.tgz -C build/var
for v in BS BN; do cp -rn vendored/sm_90a/. build/var/$v/vendored/sm_90a/; cp manifests/schema.json build/var/$v/manifests/; done
for v in BS BN; do
  VKC_ARTIFACT_ROOT=$PWD/build/var/$v timeout 60 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" \
    tests/gpu/test_gpu_gemv.py > $R/tests-$v.txt 2>&1; snap
done
echo "tests done at $SECONDS" >> $R/times.txt
for i in 1 2; do
  for v in head BS BN; do
    [ $SECONDS -gt 480 ] && break
    [ $v = head ] && r="VKC_BENCH=1" || r="VKC_ARTIFACT_ROOT=$PWD/build/var/$v"
    env $r BENCH_GEMV_SWEEP_MAX_BYTES=100e6 timeout 60 python3 benchmarks/bench_gemv.py $R/gemv-$v-$i.json 1 bf16 \
      > $R/gemv-$v-$i.txt 2>&1; snap
    env $r timeout 50 python3 benchmarks/bench_engine.py --shape 35b-a3b --batches 1 --prefill 64 --long-prefill 0 \
      --steps 32 --timeline --out $R/engine35-$v-$i.json > $R/engine35-$v-$i.txt 2>&1; snap
  done
done
echo "all done at $SECONDS" >> $R/times.txt
snap
