# session 36, call 1: session 35's call 4 (not run then; below unchanged from its line 'NAME=call4' on, but for NAME and
# the attention probe added after the MoE step): the engines at B = 1 and the MoE block at M = 1 at HEAD, the bf16
# M = 1 GEMV variants BN / BN4 (session 35's variants.py) in the 27B / 35B-A3B bf16 engines, and
# explore_attn_short.py (attention decode at short contexts with the engine's wide block table), and the router's
# top-k at 1 / 2 warps (variants.py TW1 / TW2) and the attention decode's gather loads for short splits (variants.py
# AG) in the 35B-A3B FP8 engine; the decode conv inside the GDN step (gdn_decode .conv kernels, this tree) against
# the root NOCONV (the previous commit's manifest: no .conv kernels, so the engine runs the conv as its own launch;
# the variant roots' manifests lack them too, so NOCONV is their baseline). Carry build/carry: topk-var.tgz,
# attn-var.tgz, noconv.tgz, gemv-bf16-var.tgz.
# Run with carry [".whl", "build/carry"].
NAME=call1; source tools/gpu/call_prelude.sh
export VKC_BENCH=1
for q in fp8 none nvfp4; do
  timeout 50 python3 benchmarks/bench_engine.py --shape 35b-a3b --quant $q --batches 1 --prefill 64 --long-prefill 0 \
    --steps 32 --timeline --out $R/engine35-$q.json > $R/engine35-$q.txt 2>&1; snap
done
step engine35
# session 36's top-k warp variants (variants.py TW1 / TW2; carry build/carry: topk-var.tgz) in the 35B-A3B FP8 engine
timeout 150 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" tests/gpu/test_gpu_gdn_decode.py \
  tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_engine_fp8.py > $R/tests-conv.txt 2>&1; snap
mkdir -p /tmp/m; VKC_REUSE_BUILD=1 OUT=/tmp/m MEMCHECK_TESTS=tests/gpu/test_gpu_bounds.py MEMCHECK_TIMEOUT=80 timeout 90 \
  bash tools/gpu/run.sh memcheck \
  gdn_decode > $R/memcheck-conv.txt 2>&1; cp /tmp/m/memcheck.log $R/ 2>/dev/null
step tests-conv
mkdir -p build/var && for t in topk-var attn-var noconv; do tar -xzf build/carry/$t.tgz -C build/var; done \
  && fill_root TW1 TW2 AG NOCONV
for v in NOCONV AG TW1 head NOCONV AG TW1; do
  [ $v = head ] && r="VKC_BENCH=1" || r="VKC_ARTIFACT_ROOT=$PWD/build/var/$v"
  env $r timeout 50 python3 benchmarks/bench_engine.py --shape 35b-a3b --quant fp8 --batches 1 --prefill 64 \
    --long-prefill 0 --steps 32 --timeline --out $R/engine35-fp8-$v-$SECONDS.json > $R/engine35-fp8-$v-$SECONDS.txt 2>&1; snap
done
VKC_ARTIFACT_ROOT=$PWD/build/var/TW1 timeout 60 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" \
  tests/gpu/test_gpu_moe_router.py > $R/tests-TW1.txt 2>&1; step topk
VKC_BENCH_MS=1 timeout 60 python3 benchmarks/bench_moe.py $R/moe-fp8.json fp8 > $R/moe-fp8.txt 2>&1; snap
VKC_BENCH_PATH_MS=1 timeout 60 python3 benchmarks/bench_moe.py $R/moe-paths.json paths > $R/moe-paths.txt 2>&1; snap
step moe
timeout 90 python3 benchmarks/explore_attn_short.py $R/attn-short.json > $R/attn-short.txt 2>&1; step attn
VKC_ARTIFACT_ROOT=$PWD/build/var/AG timeout 60 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" \
  tests/gpu/test_gpu_attn.py -k decode > $R/tests-AG.txt 2>&1; snap
VKC_ARTIFACT_ROOT=$PWD/build/var/AG timeout 90 python3 benchmarks/explore_attn_short.py $R/attn-short-AG.json \
  > $R/attn-short-AG.txt 2>&1; step attn-AG
[ $SECONDS -lt 330 ] && timeout 80 python3 benchmarks/bench_engine.py --shape 27b --quant fp8 --batches 1 --prefill 64 \
  --long-prefill 0 --steps 32 --timeline --out $R/engine27-fp8.json > $R/engine27-fp8.txt 2>&1
# the lead of call 3: the bf16 M = 1 GEMV variant BN in the 27B bf16 engine (carry build/carry: gemv-bf16-var.tgz)
mkdir -p build/var && tar -xzf build/carry/gemv-bf16-var.tgz -C build/var && fill_root BN BN4
for v in BN4; do
  VKC_ARTIFACT_ROOT=$PWD/build/var/$v timeout 60 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" \
    tests/gpu/test_gpu_gemv.py > $R/tests-$v.txt 2>&1; snap
  env VKC_ARTIFACT_ROOT=$PWD/build/var/$v BENCH_GEMV_SWEEP_MAX_BYTES=0 timeout 60 python3 benchmarks/bench_gemv.py \
    $R/gemv-$v.json 1 bf16 > $R/gemv-$v.txt 2>&1; snap
done
VKC_BENCH=1 BENCH_GEMV_SWEEP_MAX_BYTES=0 timeout 60 python3 benchmarks/bench_gemv.py $R/gemv-head.json 1 bf16 \
  > $R/gemv-head.txt 2>&1; snap
for v in NOCONV BN BN4 NOCONV BN BN4; do
  [ $SECONDS -gt 470 ] && break
  r="VKC_ARTIFACT_ROOT=$PWD/build/var/$v"
  env $r timeout 90 python3 benchmarks/bench_engine.py --shape 27b --batches 1 --prefill 64 --long-prefill 0 \
    --steps 32 --timeline --out $R/engine27-bf16-$v-$SECONDS.json > $R/engine27-bf16-$v-$SECONDS.txt 2>&1; snap
done
for v in BN4 NOCONV BN4; do  # the 35B-A3B bf16 engine, where BN lost
  [ $SECONDS -gt 520 ] && break
  r="VKC_ARTIFACT_ROOT=$PWD/build/var/$v"
  env $r timeout 50 python3 benchmarks/bench_engine.py --shape 35b-a3b --batches 1 --prefill 64 --long-prefill 0 \
    --steps 32 --timeline --out $R/engine35-bf16-$v-$SECONDS.json > $R/engine35-bf16-$v-$SECONDS.txt 2>&1; snap
done
step all
