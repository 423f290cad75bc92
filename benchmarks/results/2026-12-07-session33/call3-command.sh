# NOT RUN (session 33): the device time ran out before a machine started for it. The carried
# build/carry/gemv-{old,var}.tgz are rebuilt by call3-variants.py (variants) and `git show f12fdf2:...` (old).
# Variant F passes tests/test_gemv_w8a16_interp.py -k m1 (11 tests, Triton interpreter) in its build tree.
# session 33, call 3: variants of the FP8 M = 1 GEMV in one process: old (`f12fdf2`'s kernel, full-tile fp32
# accumulator, no tile ahead; the tree sent = the revert `ec5c86c`, identical), B (full-tile accumulator + the next
# tile ahead + the first tile before the wait), C (per-step sums, no tile ahead), E (call 2's variant A -- per-step sums +
# tile ahead + first tile before the wait -- at 8 warps), F (the old kernel with x and the scales loaded as [BLOCK_N,
# BLOCK_K] tiles in the weight tile's layout: no shared-memory round trip, 119 registers); each an artifact root =
# the tree's sm_90a with its two w8a16.m1 cubins + manifest (build/carry/gemv-var.tgz, made by vkc regen on the CPU box). Per root: bench_gemv
# `1 w8a16` (the rule's plans; old again at the end), GPU tests -k w8a16, the 35B-A3B FP8 engine at B = 1 (timeline)
set -x
SECONDS=0
O=$OUT; R=$O/r; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
OUT=$O/b timeout 100 bash tools/gpu/run.sh build-only > $R/build.txt 2>&1  # the wheel into /tmp/vkc-site
mkdir -p build/var && tar -xzf build/carry/gemv-var.tgz -C build/var
mkdir -p build/var/old && tar -xzf build/carry/gemv-old.tgz -C build/var/old
for v in old B C E F; do
  mkdir -p build/var/$v/vendored/sm_90a/gemv
  for f in vendored/sm_90a/*; do [ "$(basename $f)" = gemv ] || cp -r $f build/var/$v/vendored/sm_90a/; done
  for f in vendored/sm_90a/gemv/*; do [ -e build/var/$v/vendored/sm_90a/gemv/$(basename $f) ] || cp $f build/var/$v/vendored/sm_90a/gemv/; done
  cp manifests/schema.json build/var/$v/manifests/
done
export PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site TRITON_INTERPRET=0
root() { [ "$1" = A ] && echo "VKC_BENCH=1" || echo "VKC_ARTIFACT_ROOT=$PWD/build/var/$1"; }
for v in old B C E F old; do
  [ $SECONDS -gt 100 ] && break
  env $(root $v) BENCH_GEMV_SWEEP_MAX_BYTES=0 timeout 40 python3 benchmarks/bench_gemv.py $R/gemv-$v-$SECONDS.json 1 w8a16 > $R/gemv-$v-$SECONDS.txt 2>&1
done
for v in B C E F; do
  [ $SECONDS -gt 120 ] && break
  env $(root $v) timeout 40 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" tests/gpu -k w8a16 > $R/tests-$v.txt 2>&1
done
for v in old B C E F; do
  [ $SECONDS -gt 125 ] && break
  env $(root $v) timeout 60 python3 benchmarks/bench_engine.py --shape 35b-a3b --quant fp8 --batches 1 --prefill 64 \
    --long-prefill 0 --steps 32 --timeline --out $R/engine-fp8-$v.json > $R/engine-fp8-$v.txt 2>&1
done
rm -rf $O/b; tar -czf $O/call3.tgz -C $O r; rm -rf $R
