# session 34, call 1: session 33's prepared call 3 (variants of the FP8 M = 1 GEMV, ../2026-12-07-session33/
# call3-variants.py) plus G (per 128-column group: scalar scale, x loaded in the weight tile's layout, a [BLOCK_N, 128]
# accumulator; no shared-memory round trip in the K loop, 40 / 42 registers) and H (G at 2 warps); MGD (the same for the
# MoE FP8 decode gate_up, and the down kernel with h in its product's layout, variants.py) and GMGD (G + MGD). Each variant = an artifact root: HEAD's sm_90a with the
# variant's cubins + manifest (build/carry/gemv-var.tgz); old = f12fdf2's GEMV cubins (= HEAD's kernel). Per root:
# bench_gemv `1 w8a16` (the rule's plans), bench_moe fp8 at M = 1 (old, MGD), GPU tests, the 35B-A3B FP8 engine at B = 1;
# MB (the bf16 MoE decode kernels with x / h in the tile's layout): bench_moe paths at M = 1, 4 (old vs MB), GPU tests.
set -x
SECONDS=0
O=$OUT; R=$O/r; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
OUT=$O/b timeout 150 bash tools/gpu/run.sh build-only > $R/build.txt 2>&1  # the wheel into /tmp/vkc-site
echo "build done at $SECONDS" >> $R/times.txt
mkdir -p build/var && tar -xzf build/carry/gemv-var.tgz -C build/var
mkdir -p build/var/old && tar -xzf build/carry/gemv-old.tgz -C build/var/old
for v in old B C E F G H MGD GMGD MB; do
  mkdir -p build/var/$v/vendored/sm_90a && cp -rn vendored/sm_90a/. build/var/$v/vendored/sm_90a/
  cp manifests/schema.json build/var/$v/manifests/
done
export PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site TRITON_INTERPRET=0
root() { echo "VKC_ARTIFACT_ROOT=$PWD/build/var/$1"; }
for v in old G H F old G; do
  [ $SECONDS -gt 250 ] && break
  env $(root $v) BENCH_GEMV_SWEEP_MAX_BYTES=0 timeout 40 python3 benchmarks/bench_gemv.py $R/gemv-$v-$SECONDS.json 1 w8a16 > $R/gemv-$v-$SECONDS.txt 2>&1
done
for v in old MGD old MGD; do
  [ $SECONDS -gt 300 ] && break
  env $(root $v) VKC_BENCH_MS=1 timeout 40 python3 benchmarks/bench_moe.py $R/moe-$v-$SECONDS.json fp8 > $R/moe-$v-$SECONDS.txt 2>&1
done
for v in old MB old MB; do
  [ $SECONDS -gt 330 ] && break
  env $(root $v) VKC_BENCH_PATH_MS=1,4 timeout 40 python3 benchmarks/bench_moe.py $R/moe-paths-$v-$SECONDS.json paths > $R/moe-paths-$v-$SECONDS.txt 2>&1
done
echo "bench done at $SECONDS" >> $R/times.txt
for v in old GMGD; do
  [ $SECONDS -gt 400 ] && break
  env $(root $v) timeout 50 python3 benchmarks/bench_engine.py --shape 35b-a3b --quant fp8 --batches 1 --prefill 64 \
    --long-prefill 0 --steps 32 --timeline --out $R/engine-fp8-$v.json > $R/engine-fp8-$v.txt 2>&1
done
for v in GMGD MB; do
  [ $SECONDS -gt 450 ] && break
  env $(root $v) timeout 70 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" tests/gpu/test_gpu_gemv_w8a16.py \
    tests/gpu/test_gpu_moe_quant.py tests/gpu/test_gpu_moe_decode.py > $R/tests-$v.txt 2>&1
done
echo "tests done at $SECONDS" >> $R/times.txt
for v in G MGD H F B C E; do
  [ $SECONDS -gt 500 ] && break
  env $(root $v) timeout 50 python3 benchmarks/bench_engine.py --shape 35b-a3b --quant fp8 --batches 1 --prefill 64 \
    --long-prefill 0 --steps 32 --timeline --out $R/engine-fp8-$v.json > $R/engine-fp8-$v.txt 2>&1
done
for v in B C E; do
  [ $SECONDS -gt 540 ] && break
  env $(root $v) BENCH_GEMV_SWEEP_MAX_BYTES=0 timeout 40 python3 benchmarks/bench_gemv.py $R/gemv-$v-$SECONDS.json 1 w8a16 > $R/gemv-$v-$SECONDS.txt 2>&1
done
echo "engine done at $SECONDS" >> $R/times.txt
rm -rf $O/b; tar -czf $O/call1.tgz -C $O r; rm -rf $R
