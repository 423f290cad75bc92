#!/usr/bin/env bash
# session 29 call C (short form of call B): tests of the changed kernels, rope and gdn_decode A/B against HEAD~1's
# sm_90a artifacts, the 35B-A3B decode step A/B
set -u
R=$PWD; O=$OUT
OUT=$O/t timeout 120 bash tools/gpu/run.sh tests "rope or test_gpu_norm or test_gpu_moe_router or test_gpu_gdn_decode or test_gpu_bounds or test_gpu_capture" > $O/tests.txt 2>&1; tail -2 $O/tests.txt; echo "t=$SECONDS"
export PYTHONPATH=/tmp/vkc-site:$R:/tmp/peer-site TRITON_INTERPRET=0
mkdir -p /tmp/ab && tar -xzf build/s29/old.tgz -C /tmp/ab
for r in new old new old; do
  if [ $r = old ]; then echo "old $(env VKC_IMPORT_CHECK=0 VKC_ARTIFACT_ROOT=/tmp/ab/old timeout 40 python3 benchmarks/tune_rope.py 2>&1 | tail -1)" >> $O/rope_ab.txt
  else echo "new $(timeout 40 python3 benchmarks/tune_rope.py 2>&1 | tail -1)" >> $O/rope_ab.txt; fi
done; cut -c1-600 $O/rope_ab.txt; echo "rope ab t=$SECONDS"
for r in new old; do
  if [ $r = old ]; then env VKC_IMPORT_CHECK=0 VKC_ARTIFACT_ROOT=/tmp/ab/old timeout 60 python3 benchmarks/bench_gdn_decode.py $O/gdn-$r.json > $O/gdn-$r.log 2>&1
  else timeout 60 python3 benchmarks/bench_gdn_decode.py $O/gdn-$r.json > $O/gdn-$r.log 2>&1; fi
  echo "gdn $r t=$SECONDS"; grep -E '^decode' -A8 $O/gdn-$r.log | head -10
done
E="python3 benchmarks/bench_engine.py --shape 35b-a3b --batches 1,4 --prefill 64 --long-prefill 0 --steps 32 --timeline"
for r in new old; do
  [ $SECONDS -gt 230 ] && break
  if [ $r = old ]; then env VKC_IMPORT_CHECK=0 VKC_ARTIFACT_ROOT=/tmp/ab/old timeout 60 $E --out $O/eng-$r.json > $O/eng-$r.log 2>&1
  else timeout 60 $E --out $O/eng-$r.json > $O/eng-$r.log 2>&1; fi
  echo "$r t=$SECONDS $(grep -o '"ms_per_step": [0-9.]*' $O/eng-$r.log | head -2 | tr '\n' ' ')"
done
cd $O && tar -czf /tmp/all.tgz . && mv /tmp/all.tgz $O/all.tgz; echo "t=$SECONDS"
