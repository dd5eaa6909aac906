#!/usr/bin/env bash
# Builds the GPU check kit here (no GPU needed): every test binary, example
# and bench that runs CUDA code, in release with `--features cuda`, plus the
# debug build of tests/cuda.rs (its cross-lane must-fail test reads
# DEPFLOW_DEBUG_NO_LANE_WAITS in debug builds only). Strips them and copies
# them, with run.sh and a manifest, into one folder (default
# target/gpu-kit), which is all a GPU machine without Rust needs:
#
#   scripts/gpu-check/build.sh            # here
#   target/gpu-kit/run.sh OUT             # there (see run.sh)
#
# Prints the folder's size and fails if it is over 48 MiB (a GPU session
# carries at most 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT="${1:-target/gpu-kit}"
FEATURES="${GPU_KIT_FEATURES:-cuda}"

# What the kit runs, by kind. Test binaries that touch CUDA or NCCL, and the
# stream, capture and device-memory tests whose code paths the CUDA device
# shares (they run on the simulated GPU there too, in seconds).
TESTS=(cuda nccl differential streams graph_capture graph_device_memory graph_streams)
EXAMPLES=(gpu_pipeline data_parallel)
BENCHES=(gpu workloads)

# Cargo's JSON messages name each built executable: "<kind>/<name> <path>".
executables() {
  jq -r 'select(.reason == "compiler-artifact" and .executable != null)
         | "\(.target.kind[0])/\(.target.name) \(.executable)"'
}

echo "==> building (release, --features $FEATURES)"
{
  cargo test --release --features "$FEATURES" --no-run --message-format=json \
    $(printf -- '--test %s ' "${TESTS[@]}")
  cargo build --release --features "$FEATURES" --message-format=json \
    $(printf -- '--example %s ' "${EXAMPLES[@]}")
  cargo bench --features "$FEATURES" --no-run --message-format=json \
    $(printf -- '--bench %s ' "${BENCHES[@]}")
} | executables > target/gpu-kit.release.list
echo "==> building tests/cuda.rs in debug (the cross-lane must-fail test)"
cargo test --features "$FEATURES" --no-run --message-format=json --test cuda \
  | executables | sed 's|^test/cuda |test/cuda-debug |' > target/gpu-kit.debug.list

rm -rf "$KIT"
mkdir -p "$KIT/bin"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
dirty="$(git status --porcelain 2>/dev/null | grep -q . && echo ' (with uncommitted changes)' || true)"
{
  echo "# depflow GPU check kit"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) from $commit$dirty, features: $FEATURES, $(rustc --version)"
  echo
  echo "| binary | from | bytes |"
  echo "| --- | --- | --- |"
} > "$KIT/MANIFEST.md"
while read -r kind_name path; do
  name="${kind_name#*/}"
  kind="${kind_name%%/*}"
  [ "$kind" = bin ] && continue
  out="$KIT/bin/$kind-$name"
  strip -o "$out" "$path"
  echo "| bin/$kind-$name | $kind \`$name\` | $(stat -c %s "$out") |" >> "$KIT/MANIFEST.md"
done < <(cat target/gpu-kit.release.list target/gpu-kit.debug.list)

# Every expected binary is there (a renamed test must not drop out silently).
for t in "${TESTS[@]}" cuda-debug; do
  [ -x "$KIT/bin/test-$t" ] || { echo "missing test binary: $t" >&2; exit 1; }
done
for e in "${EXAMPLES[@]}"; do
  [ -x "$KIT/bin/example-$e" ] || { echo "missing example: $e" >&2; exit 1; }
done
for b in "${BENCHES[@]}"; do
  [ -x "$KIT/bin/bench-$b" ] || { echo "missing bench: $b" >&2; exit 1; }
done
cp scripts/gpu-check/run.sh "$KIT/run.sh"
chmod +x "$KIT/run.sh"

bytes="$(du -sb "$KIT" | cut -f1)"
echo "==> $KIT: $(ls "$KIT/bin" | wc -l) binaries, $((bytes / 1024 / 1024)) MiB ($bytes bytes)"
if [ "$bytes" -gt $((48 * 1024 * 1024)) ]; then
  echo "the kit is over 48 MiB: a GPU session carries at most 64 MiB" >&2
  exit 1
fi
