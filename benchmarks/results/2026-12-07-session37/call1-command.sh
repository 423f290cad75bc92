# session 37, call 1 (carry [".whl", "build/carry"]), HEAD's artifacts and root CB (variants.py: the attention decode
# merges stop at the last live split). In priority order (later steps guarded by the call's clock):
#   attention decode under the engine's 32768-token table at 100-1000 keys, head and CB, per-kernel times
#   (explore_attn_short.py, TMA kernels, torch.profiler) -> the 35B-A3B engine bf16 at B = 1, 4: head / CB / head / CB
#   -> FP8 and NVFP4 at B = 1 (head) -> CB's decode tests -> the MoE block at M = 1 (bf16 decode path, FP8) ->
#   session 36's call 3 cases (long contexts, B 1-16), head -> the 27B FP8 engine at B = 1 if time is left.
NAME=call1; source tools/gpu/call_prelude.sh
mkdir -p build/var && tar -xzf build/carry/cb-var.tgz -C build/var && fill_root CB
eng() {  # eng ROOT SHAPE QUANT BATCHES TIMEOUT (ROOT head: this tree's artifacts)
  local r="VKC_BENCH=1"; [ "$1" = head ] || r="VKC_ARTIFACT_ROOT=$PWD/build/var/$1"
  local n=engine-$2-$3-b${4//,/-}-$1-$SECONDS
  env $r timeout $5 python3 benchmarks/bench_engine.py --shape $2 --quant $3 --batches $4 --prefill 64 \
    --long-prefill 0 --steps 32 --timeline --out $R/$n.json > $R/$n.txt 2>&1
  snap
}
short() {  # short ROOT
  local r="VKC_BENCH=1"; [ "$1" = head ] || r="VKC_ARTIFACT_ROOT=$PWD/build/var/$1"
  env $r ATTN_SHORT_PROFILE=1 ATTN_SHORT_GATHER=0 ATTN_SHORT_SPLITS="2 4 8 16 32" \
    ATTN_SHORT_CASES="4x100 4x1000 1x100 16x1000" timeout 70 python3 benchmarks/explore_attn_short.py \
    $R/attn-short-$1.json > $R/attn-short-$1.txt 2>&1
  snap
}
short head; short CB; step short
for v in head CB head CB; do eng $v 35b-a3b none 1,4 70; done
step engine35-bf16
eng head 35b-a3b fp8 1 50
eng head 35b-a3b nvfp4 1 50
step engine35-quant
VKC_ARTIFACT_ROOT=$PWD/build/var/CB timeout 60 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" \
  tests/gpu/test_gpu_attn.py -k decode > $R/tests-CB.txt 2>&1; step tests-CB
[ $SECONDS -lt 470 ] && VKC_BENCH_PATH_MS=1 timeout 40 python3 benchmarks/bench_moe.py $R/moe-paths.json paths \
  > $R/moe-paths.txt 2>&1
[ $SECONDS -lt 490 ] && VKC_BENCH_MS=1 timeout 40 python3 benchmarks/bench_moe.py $R/moe-fp8.json fp8 > $R/moe-fp8.txt 2>&1
step moe
(while sleep 20; do snap; done) &  # the probe prints each row as it goes
[ $SECONDS -lt 520 ] && ATTN_SHORT_GATHER=0 ATTN_SHORT_SPLITS="4 8 16 32" \
  ATTN_SHORT_CASES="4x8000 4x30000 8x1000 8x8000 8x30000 16x30000 1x30000 2x1000 2x30000" \
  timeout $((570 - SECONDS)) python3 benchmarks/explore_attn_short.py $R/attn-long.json > $R/attn-long.txt 2>&1
kill %1 2>/dev/null
step all
