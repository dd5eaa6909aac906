#!/usr/bin/env bash
# Checks the GPU check kit where there is no GPU (CI, this machine): run.sh
# must finish within a minute, report every GPU step as failed, pass the
# steps that need no GPU, and exit non-zero. Run after build.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT="${1:-target/gpu-kit}"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "dry-run.sh: this machine has a GPU; run $KIT/run.sh OUT instead" >&2
  exit 1
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
t0=$SECONDS
if "$KIT/run.sh" "$out" > "$out/stdout" 2>&1; then
  cat "$out/stdout"; echo "dry-run.sh: run.sh exited 0 without a GPU" >&2; exit 1
fi
took=$((SECONDS - t0))
report="$out/report.md"
fail() { cat "$report"; echo "dry-run.sh: $*" >&2; exit 1; }
[ "$took" -le 60 ] || fail "run.sh took ${took}s without a GPU (at most 60)"
# verdict STEP: the result column of the step's row.
verdict() { awk -F' \\| ' -v s="| $1" 'index($0, s " |") == 1 { print $2 }' "$report"; }
for s in tests/cuda.rs tests/nccl.rs tests/differential.rs \
  "cross-lane test fails without the wait (debug)" examples/gpu_pipeline.rs \
  "examples/data_parallel.rs --cuda" benches/gpu.rs; do
  [ "$(verdict "$s")" = failed ] || fail "GPU step '$s' is '$(verdict "$s")', not failed"
done
for s in tests/streams.rs tests/graph_capture.rs tests/graph_device_memory.rs tests/graph_streams.rs; do
  [ "$(verdict "$s")" = passed ] || fail "step '$s' needs no GPU but is '$(verdict "$s")'"
done
[ -s "$out/run.log" ] || fail "no run.log"
echo "dry-run.sh: run.sh without a GPU: every GPU step failed, the rest passed, exit non-zero, ${took}s"
