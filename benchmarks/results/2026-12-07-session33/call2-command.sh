# session 33, call 2 (one call for all that is left of the device time): (a) GPU tests of the FP8 GEMVs (the new M = 1
# kernel: per-step sums, the next tile loaded ahead); (b) that kernel (the tree) against HEAD's (build/carry/gemv-old.tgz:
# HEAD's two w8a16.m1 cubins + manifest), bench_gemv `1 w8a16`, the rule's plans, old / new; (c) the 35B-A3B FP8 engine
# at B = 1 on both roots (timeline); (d) `vkc tune run` of the router's candidates (route.topk.e256 num_warps 1/2/8,
# route.logits.small num_warps 1/2/8, BE 16/64, BK 64/256; built with `vkc tune build`, carried as their moe family + a
# manifest (the tree's, moe entries from the candidate) in build/carry/router.tgz; `base` = the tree), benchmarks/tune_moe.py
set -x
SECONDS=0
O=$OUT; R=$O/r; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
OUT=$O/b timeout 100 bash tools/gpu/run.sh build-only > $R/build.txt 2>&1  # the wheel into /tmp/vkc-site
mkdir -p build/ab-old/vendored && cp -r vendored/sm_90a build/ab-old/vendored/ && mkdir -p build/ab-old/manifests && \
  cp manifests/schema.json build/ab-old/manifests/ && tar -xzf build/carry/gemv-old.tgz -C build/ab-old
export PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site TRITON_INTERPRET=0
OLD="VKC_ARTIFACT_ROOT=$PWD/build/ab-old"
for step in old new; do
  if [ $step = new ]; then E="BENCH_GEMV_SWEEP_MAX_BYTES=0"; else E="$OLD BENCH_GEMV_SWEEP_MAX_BYTES=0"; fi
  env $E timeout 60 python3 benchmarks/bench_gemv.py $R/gemv-$step.json 1 w8a16 > $R/gemv-$step.txt 2>&1
done
OUT=$O/g VKC_REUSE_BUILD=1 TEST_TIMEOUT=90 timeout 110 bash tools/gpu/run.sh tests "w8a16" > $R/tests.txt 2>&1; cp $O/g/gpu-tests.log $R/
[ $SECONDS -lt 230 ] && \
for step in new old; do
  if [ $step = new ]; then E="VKC_BENCH=1"; else E="$OLD"; fi
  env $E timeout 90 python3 benchmarks/bench_engine.py --shape 35b-a3b --quant fp8 --batches 1 --prefill 64 \
    --long-prefill 0 --steps 32 --timeline --out $R/engine-fp8-$step.json > $R/engine-fp8-$step.txt 2>&1
done
mkdir -p build/tune && tar -xzf build/carry/router.tgz -C build/tune
B=build/tune/router
mkdir -p $B/base/vendored $B/base/manifests; cp -r vendored/sm_90a $B/base/vendored/
cp manifests/sm_90a.json manifests/schema.json $B/base/manifests/
echo '{"arch": "sm_90a", "family": "moe", "knob": "num_warps", "value": 4, "fixed": {}, "specs": ["route.topk.e256", "route.logits.small"]}' > $B/base/candidate.json
for c in $B/*/; do [ "$c" = "$B/base/" ] && continue
  for f in vendored/sm_90a/*; do [ "$(basename $f)" = moe ] || cp -r $f $c/vendored/sm_90a/; done; done
# each candidate in its own process (what `vkc tune run` does), one file each: a time limit keeps what ran
i=0
for c in base topk_num_warps1 topk_num_warps2 topk_num_warps8 logits_num_warps2 logits_num_warps8 logits_BK256 \
         logits_BE16 logits_BE64 logits_num_warps1 logits_BK64 base; do
  i=$((i + 1)); [ $SECONDS -gt 370 ] && break  # the device time left: leave time to pack what ran
  VKC_ARTIFACT_ROOT=$PWD/$B/$c timeout 25 python3 benchmarks/tune_moe.py > $R/tune-$i-$c.txt 2>&1
done
rm -rf $O/g $O/b; tar -czf $O/call2.tgz -C $O r; rm -rf $R
