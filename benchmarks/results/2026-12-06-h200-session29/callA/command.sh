#!/usr/bin/env bash
# session 29 call A: L2 prefetch before the grid-dependency wait (gemv MMA, router logits, gdn_decode): GPU tests of
# the changed kernels, then the 35B-A3B bf16 decode step with the old (HEAD) and new sm_90a artifacts, alternating
set -u
R=$PWD; O=$OUT
OUT=$O/t timeout 200 bash tools/gpu/run.sh tests "test_gpu_gdn_decode or test_gpu_gemv or test_gpu_moe_router or test_gpu_moe_decode or test_gpu_bounds" > $O/tests.txt 2>&1; tail -3 $O/tests.txt; echo "t=$SECONDS"
export PYTHONPATH=/tmp/vkc-site:$R:/tmp/peer-site TRITON_INTERPRET=0
mkdir -p /tmp/ab && tar -xzf build/s29/old.tgz -C /tmp/ab
E="python3 benchmarks/bench_engine.py --shape 35b-a3b --batches 1,4 --prefill 64 --long-prefill 0 --steps 32 --timeline"
for r in new old new old; do
  left=$((580 - SECONDS)); [ $left -lt 60 ] && break
  if [ $r = old ]; then env VKC_IMPORT_CHECK=0 VKC_ARTIFACT_ROOT=/tmp/ab/old timeout $left $E --out $O/eng-$r-$SECONDS.json > $O/eng-$r.log 2>&1
  else timeout $left $E --out $O/eng-$r-$SECONDS.json > $O/eng-$r.log 2>&1; fi
  echo "$r t=$SECONDS $(grep -o '"ms_per_step": [0-9.]*' $O/eng-$r.log | head -2 | tr '\n' ' ')"
done
tail -3 $O/eng-old.log | cut -c1-300
