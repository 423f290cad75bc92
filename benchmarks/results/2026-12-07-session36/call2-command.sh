# NOT RUN (session 36): the device refused the start; the conv-in-step code was reverted after call 1 (e06d613), so CT
# can only be timed from a tree that has it (a68389d).
# session 36, call 2 (carry [".whl", "build/carry"]): call 1 found the conv inside the GDN step 0.2% slower than the
# conv launch (35B-A3B FP8, H100). Variant CT (variants.py: the q / k conv-state ticket after the recurrent step)
# against NOCONV (the conv as its own launch) and head (ticket before the step): its GPU conv tests, then the
# 35B-A3B FP8 and bf16 engines at B = 1 alternating.
NAME=call2; source tools/gpu/call_prelude.sh
mkdir -p build/var && for t in noconv ct-var; do tar -xzf build/carry/$t.tgz -C build/var; done; fill_root NOCONV CT
VKC_ARTIFACT_ROOT=$PWD/build/var/CT timeout 60 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" \
  tests/gpu/test_gpu_gdn_decode.py tests/gpu/test_gpu_bounds.py -k "conv or gdn_decode" > $R/tests-CT.txt 2>&1
step tests-CT
eng35() {  # eng35 ROOT QUANT
  local r="VKC_BENCH=1"; [ "$1" = head ] || r="VKC_ARTIFACT_ROOT=$PWD/build/var/$1"
  env $r timeout 50 python3 benchmarks/bench_engine.py --shape 35b-a3b --quant $2 --batches 1 --prefill 64 \
    --long-prefill 0 --steps 32 --timeline --out $R/engine35-$2-$1-$SECONDS.json > $R/engine35-$2-$1-$SECONDS.txt 2>&1
  snap
}
for v in NOCONV CT head NOCONV CT head; do [ $SECONDS -lt 250 ] && eng35 $v fp8; done
for v in NOCONV CT NOCONV CT; do [ $SECONDS -lt 300 ] && eng35 $v none; done
step all
