#!/usr/bin/env bash
# session 28 call 1: conv + bounds + norm tests, norm A/B (8192 block vs 5 x 1024 slices), conv old/new A/B,
# rope num_warps tune, memcheck over the conv bounds cases, attn decode split sweep (whatever time is left)
set -u
R=$PWD; O=$OUT
OUT=$O/t bash tools/gpu/run.sh tests "conv or bounds or norm" > $O/tests.txt 2>&1; tail -4 $O/tests.txt; echo "t=$SECONDS"
export PYTHONPATH=/tmp/vkc-site:$R TRITON_INTERPRET=0
for i in 1 2; do python3 benchmarks/tune_norm.py >> $O/norm_ab.jsonl 2>>$O/norm_ab.err; done; echo "norm t=$SECONDS"
mkdir -p /tmp/ab && tar -xzf build/ab/roots.tgz -C /tmp/ab
for r in old new old new; do echo "$r $(VKC_ARTIFACT_ROOT=/tmp/ab/$r python3 benchmarks/tune_conv.py 2>&1 | tail -1)" >> $O/conv_ab.txt; done; echo "conv t=$SECONDS"
python3 benchmarks/tune_rope.py > $O/rope_base.json 2>&1; VKC_IMPORT_CHECK=0 VKC_REUSE_BUILD=1 OUT=$O/r bash tools/gpu/run.sh tune > $O/rope_tune.txt 2>&1; python3 benchmarks/tune_rope.py >> $O/rope_base.json 2>&1; grep -A3 "tune run" $O/rope_tune.txt | head; echo "rope t=$SECONDS"
VKC_REUSE_BUILD=1 OUT=$O/m MEMCHECK_TESTS=tests/gpu/test_gpu_bounds.py bash tools/gpu/run.sh memcheck "conv" > $O/memcheck.txt 2>&1; tail -2 $O/memcheck.txt; echo "mc t=$SECONDS"
left=$((575 - SECONDS)); [ $left -gt 20 ] && BENCH_ATTN=decode BENCH_ATTN_DECODE_BS=64 BENCH_ATTN_DECODE_CASES="64x32768 256x4096 16x32768 64x4096" BENCH_ATTN_SPLITS="1 2 3 4 8 16" timeout $left python3 benchmarks/bench_attn.py $O/attn_sweep.json > $O/attn_sweep.log 2>&1; tail -2 $O/attn_sweep.log
cd $O && tar -czf $O/all.tgz t r m conv_ab.txt norm_ab.jsonl norm_ab.err attn_sweep.json attn_sweep.log tests.txt memcheck.txt rope_tune.txt rope_base.json 2>/dev/null; ls $O
