#!/usr/bin/env bash
# session 29 call 1: exploration of the streaming kernels (rope / conv / gdn decode tiles, attention decode layout)
set -u
R=$PWD; O=$OUT
OUT=$O/t bash tools/gpu/run.sh tests "zz_build_only_zz" > $O/build.txt 2>&1; tail -3 $O/build.txt; echo "t=$SECONDS"
export PYTHONPATH=/tmp/vkc-site:$R TRITON_INTERPRET=0
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv > $O/gpu.txt
timeout 480 python3 benchmarks/explore_stream.py $O/explore.json rope conv gdn > $O/explore.log 2>&1; echo "rc=$?"
grep -v '^$' $O/explore.log | cut -c1-260 | tail -60; echo "t=$SECONDS"
