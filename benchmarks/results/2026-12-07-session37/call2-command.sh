# session 37, call 2 (carry [".whl", "build/carry"]). This tree: the attention decode combine with its first
# block's loads beside the lse pass and the reads stopped at the last live split, and no fused merge by default
# with the TMA kernels. OLD = the previous commit: its attn cubins + manifest (build/carry/old-attn.tgz) and its
# decode_ops.py (build/carry/old_decode_ops.py) in a copy of the installed runtime (/tmp/vkc-old).
# In priority order: GPU tests of attention decode and the engine -> explore_attn_short.py new / OLD ->
# the 35B-A3B bf16 engine under a 32768-token table at ~100 and ~1000 keys, B = 1 / 4 / 16, new / OLD
# alternating -> memcheck of the decode bounds cases -> the same engine rows at bench_engine's own table width.
NAME=call2; source tools/gpu/call_prelude.sh
mkdir -p build/var && tar -xzf build/carry/old-attn.tgz -C build/var && fill_root OLD
cp -r /tmp/vkc-site /tmp/vkc-old && cp build/carry/old_decode_ops.py /tmp/vkc-old/vkc_runtime/ops/attn/decode_ops.py
old() { env PYTHONPATH=/tmp/vkc-old:$PWD:/tmp/peer-site VKC_ARTIFACT_ROOT=$PWD/build/var/OLD "$@"; }
timeout 150 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" tests/gpu/test_gpu_attn.py \
  tests/gpu/test_gpu_engine.py > $R/tests.txt 2>&1; step tests
short() {  # short TAG [old]
  local t=$1; shift
  ${1:-env} ATTN_SHORT_PROFILE=1 ATTN_SHORT_GATHER=0 ATTN_SHORT_SPLITS="4 16" \
    ATTN_SHORT_CASES="1x100 4x100 4x1000 16x1000 4x8000 1x30000 16x30000" timeout 80 \
    python3 benchmarks/explore_attn_short.py $R/attn-short-$t.json > $R/attn-short-$t.txt 2>&1
  snap
}
short new; short old old; step short
eng() {  # eng TAG PROMPT BATCHES [old]
  local n=engine-$1-p$2-$SECONDS
  ${4:-env} VKC_BENCH=1 timeout 80 python3 benchmarks/bench_engine.py --shape 35b-a3b --quant none --batches $3 \
    --prefill 64 --long-prefill 0 --steps 32 --timeline --max-model-len 32768 --decode-prompt $2 \
    --out $R/$n.json > $R/$n.txt 2>&1
  snap
}
eng new 100 1,4,16; eng old 100 1,4,16 old; eng new 1000 1,4,16; eng old 1000 1,4,16 old
[ $SECONDS -lt 400 ] && { eng new 100 1,4,16; eng old 100 1,4,16 old; }
step engine
[ $SECONDS -lt 480 ] && { mkdir -p /tmp/m; VKC_REUSE_BUILD=1 OUT=/tmp/m MEMCHECK_TESTS=tests/gpu/test_gpu_bounds.py \
  MEMCHECK_TIMEOUT=70 timeout 80 bash tools/gpu/run.sh memcheck decode > $R/memcheck.txt 2>&1; cp /tmp/m/memcheck.log $R/ 2>/dev/null; }
step all
