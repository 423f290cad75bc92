# session 33, call 2: (a) `vkc tune run` of the router's candidates (route.topk.e256 num_warps 1/2/8,
# route.logits.small num_warps 1/2/8, BE 16/64, BK 64/256; built on the CPU box with `vkc tune build`, carried as
# their moe family + a manifest (the tree's, moe entries from the candidate) in build/carry/router.tgz; the other
# families and the `base` candidate (today's tuning) are the tree's sm_90a artifacts), timed by
# benchmarks/tune_moe.py; (b) the FP8 M = 1 GEMV with per-step sums and one tile ahead (the tree) against HEAD's
# kernel (build/carry/gemv-old.tgz: HEAD's two w8a16.m1 cubins + manifest), bench_gemv `1 w8a16`, old / new;
# (c) GPU tests of the gemv family
set -x
O=$OUT; R=$O/r; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
mkdir -p build/tune && tar -xzf build/carry/router.tgz -C build/tune
B=build/tune/router
mkdir -p $B/base/vendored $B/base/manifests; cp -r vendored/sm_90a $B/base/vendored/
cp manifests/sm_90a.json manifests/schema.json $B/base/manifests/
echo '{"arch": "sm_90a", "family": "moe", "knob": "num_warps", "value": 4, "fixed": {}, "specs": ["route.topk.e256", "route.logits.small"]}' > $B/base/candidate.json
for c in $B/*/; do [ "$c" = "$B/base/" ] && continue
  for f in vendored/sm_90a/*; do [ "$(basename $f)" = moe ] || cp -r $f $c/vendored/sm_90a/; done; done
OUT=$O/t timeout 250 bash tools/gpu/run.sh tune > $R/tune.txt 2>&1; cp $O/t/results.json $R/tune-results.json
mkdir -p build/ab-old/vendored && cp -r vendored/sm_90a build/ab-old/vendored/ && mkdir -p build/ab-old/manifests && \
  cp manifests/schema.json build/ab-old/manifests/ && tar -xzf build/carry/gemv-old.tgz -C build/ab-old
export PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site TRITON_INTERPRET=0
for step in old new; do
  if [ $step = new ]; then E="BENCH_GEMV_SWEEP_MAX_BYTES=30e6"; else E="VKC_ARTIFACT_ROOT=$PWD/build/ab-old BENCH_GEMV_SWEEP_MAX_BYTES=0"; fi
  env $E timeout 110 python3 benchmarks/bench_gemv.py $R/gemv-$step.json 1 w8a16 > $R/gemv-$step.txt 2>&1
done
OUT=$O/g VKC_REUSE_BUILD=1 TEST_TIMEOUT=110 timeout 120 bash tools/gpu/run.sh tests "gemv" > $R/tests.txt 2>&1; cp $O/g/gpu-tests.log $R/
rm -rf $O/t $O/g; tar -czf $O/call2.tgz -C $O r; rm -rf $R
