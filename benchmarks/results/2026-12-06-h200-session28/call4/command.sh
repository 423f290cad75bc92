#!/usr/bin/env bash
# session 28 call 4 (slim): gemm_fp4 (sm_90a emulation) + norm/rope GPU tests, conv old/new A/B, a short memcheck
set -u
R=$PWD; O=$OUT
OUT=$O/t bash tools/gpu/run.sh tests "gemm_fp4 or test_gpu_norm" > $O/tests.txt 2>&1; tail -3 $O/tests.txt; echo "t=$SECONDS"
export PYTHONPATH=/tmp/vkc-site:$R TRITON_INTERPRET=0
mkdir -p /tmp/ab && tar -xzf build/ab/roots.tgz -C /tmp/ab
for r in old new old new; do echo "$r $(VKC_IMPORT_CHECK=0 VKC_ARTIFACT_ROOT=/tmp/ab/$r python3 benchmarks/tune_conv.py 2>&1 | tail -1)" >> $O/conv_ab.txt; done; cut -c1-200 $O/conv_ab.txt; echo "conv t=$SECONDS"
python3 benchmarks/tune_rope.py > $O/rope_new.json 2>&1; echo "rope t=$SECONDS"
left=$((235 - SECONDS)); [ $left -gt 30 ] && VKC_REUSE_BUILD=1 OUT=$O/m MEMCHECK_TESTS="tests/gpu/test_gpu_gemm_fp4.py" MEMCHECK_TIMEOUT=$left bash tools/gpu/run.sh memcheck "odd_legal or bad_inputs or quantizer" > $O/memcheck.txt 2>&1; tail -2 $O/memcheck.txt; echo "mc t=$SECONDS"
cd $O && tar -czf $O/all.tgz t m tests.txt rope_new.json conv_ab.txt memcheck.txt 2>/dev/null; ls $O
