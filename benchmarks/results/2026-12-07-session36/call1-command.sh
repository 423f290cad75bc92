# session 36, call 1 (carry [".whl", "build/carry"]). This tree: the decode conv inside the GDN step (gdn_decode
# .conv kernels). Root NOCONV = the previous commit's manifest (no .conv kernels: the engine launches the conv on
# its own; same cubins otherwise); the variant roots (variants.py TW1: the router's top-k at 1 warp, AG: the
# attention decode's gather loads for splits of <= 2 tiles; session 35's BN / BN4 bf16 M = 1 GEMVs) lack the .conv
# kernels too, so NOCONV is their baseline. In priority order (later steps guarded by the call's clock):
#   GPU tests of the conv path (gdn_decode, the engines vs HF) -> the 35B-A3B FP8 engine at B = 1, NOCONV / head /
#   AG / TW1 alternating -> the 35B-A3B engine bf16 / nvfp4 at head -> memcheck of the gdn_decode bounds cases ->
#   attention decode at short contexts (explore_attn_short.py, head and AG) + AG's decode tests -> TW1's router
#   tests -> bench_moe fp8 / paths at M = 1 -> 27B FP8 engine -> session 35's call 4 remainder (BN / BN4).
NAME=call1; source tools/gpu/call_prelude.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" tests/gpu/test_gpu_gdn_decode.py \
  tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_engine_fp8.py > $R/tests-conv.txt 2>&1; step tests-conv
mkdir -p build/var && for t in topk-var attn-var noconv gemv-bf16-var; do tar -xzf build/carry/$t.tgz -C build/var; done
fill_root TW1 AG NOCONV BN BN4
eng35() {  # eng35 ROOT QUANT: the 35B-A3B engine at B = 1 (ROOT head: this tree's artifacts)
  local r="VKC_BENCH=1"; [ "$1" = head ] || r="VKC_ARTIFACT_ROOT=$PWD/build/var/$1"
  env $r timeout 50 python3 benchmarks/bench_engine.py --shape 35b-a3b --quant $2 --batches 1 --prefill 64 \
    --long-prefill 0 --steps 32 --timeline --out $R/engine35-$2-$1-$SECONDS.json > $R/engine35-$2-$1-$SECONDS.txt 2>&1
  snap
}
for v in NOCONV head AG TW1 NOCONV head AG TW1; do eng35 $v fp8; done
step engine35-fp8
for q in none nvfp4; do eng35 head $q; done
[ $SECONDS -lt 330 ] && eng35 NOCONV none
step engine35-other
mkdir -p /tmp/m; VKC_REUSE_BUILD=1 OUT=/tmp/m MEMCHECK_TESTS=tests/gpu/test_gpu_bounds.py MEMCHECK_TIMEOUT=70 \
  timeout 80 bash tools/gpu/run.sh memcheck gdn_decode > $R/memcheck-conv.txt 2>&1; cp /tmp/m/memcheck.log $R/ 2>/dev/null
step memcheck
timeout 60 python3 benchmarks/explore_attn_short.py $R/attn-short.json > $R/attn-short.txt 2>&1; snap
VKC_ARTIFACT_ROOT=$PWD/build/var/AG timeout 60 python3 benchmarks/explore_attn_short.py $R/attn-short-AG.json \
  > $R/attn-short-AG.txt 2>&1; snap
VKC_ARTIFACT_ROOT=$PWD/build/var/AG timeout 50 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" \
  tests/gpu/test_gpu_attn.py -k decode > $R/tests-AG.txt 2>&1; step attn
[ $SECONDS -lt 480 ] && VKC_ARTIFACT_ROOT=$PWD/build/var/TW1 timeout 40 python3 -m pytest -q -p no:cacheprovider \
  -m "gpu and not peer" tests/gpu/test_gpu_moe_router.py > $R/tests-TW1.txt 2>&1
[ $SECONDS -lt 500 ] && VKC_BENCH_MS=1 timeout 40 python3 benchmarks/bench_moe.py $R/moe-fp8.json fp8 > $R/moe-fp8.txt 2>&1
snap
[ $SECONDS -lt 520 ] && VKC_BENCH_PATH_MS=1 timeout 40 python3 benchmarks/bench_moe.py $R/moe-paths.json paths \
  > $R/moe-paths.txt 2>&1
step moe
[ $SECONDS -lt 510 ] && VKC_BENCH=1 timeout 70 python3 benchmarks/bench_engine.py --shape 27b --quant fp8 --batches 1 \
  --prefill 64 --long-prefill 0 --steps 32 --timeline --out $R/engine27-fp8.json > $R/engine27-fp8.txt 2>&1
step all
