# The common start of a device call's record script (benchmarks/results/<session>/callN-command.sh), sourced from
# the repository root on the device:  NAME=call4; source tools/gpu/call_prelude.sh
# It times from 0 (SECONDS), keeps results in R=/tmp/r (outside $OUT: a call cut short by the budget still returns
# what ran), builds and installs the sm_90a wheel (tools/gpu/run.sh build-only into /tmp/vkc-site) and exports the
# PYTHONPATH that runs the tree against it. Then:
#   snap                 tar R to $OUT/$NAME.tgz (after each step)
#   step LABEL           note "LABEL done at <seconds>" in R/times.txt, then snap
#   fill_root V [V ...]  complete the variant roots build/var/V (tools/variant_root.py: the changed artifacts and
#                        their manifest) with the head's other sm_90a artifacts and the manifest schema; select
#                        one with VKC_ARTIFACT_ROOT=$PWD/build/var/V
set -x
SECONDS=0
O=$OUT; R=/tmp/r; mkdir -p "$R"
snap() { tar -czf "$O/$NAME.tgz" -C /tmp r; }
step() { echo "$1 done at $SECONDS" >> "$R/times.txt"; snap; }
fill_root() {
  local v
  for v in "$@"; do
    cp -rn vendored/sm_90a/. "build/var/$v/vendored/sm_90a/"; cp manifests/schema.json "build/var/$v/manifests/"
  done
}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$R/gpu.txt"
OUT=/tmp/b timeout 150 bash tools/gpu/run.sh build-only > "$R/build.txt" 2>&1
step build
export PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site TRITON_INTERPRET=0
