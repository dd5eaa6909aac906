#!/usr/bin/env bash
# Runs the GPU check kit (built by scripts/gpu-check/build.sh) on a machine
# with a GPU, CUDA and no Rust, in one pass of at most 8 minutes:
#
#   target/gpu-kit/run.sh OUT      # OUT: a folder for the results
#
# 1. what the machine has: nvidia-smi, the driver and CUDA versions, and where
#    libcuda, libnvrtc, libcublas and libnccl are (system, /usr/local/cuda,
#    or Python wheels such as nvidia-nccl-cu13); it links the names cudarc
#    opens (libcuda.so, libnvrtc.so, libnccl.so) to what it found, in a
#    folder first on LD_LIBRARY_PATH, the toolkit's NVRTC before a wheel's;
# 2. every test binary with DEPFLOW_REQUIRE_GPU=1 (a skip is a failure), and
#    the debug build's cross-lane test, which must see the consumer run first
#    with the engine's cross-lane wait stubbed out;
# 3. the examples and benches/gpu.rs; then compute-sanitizer memcheck and
#    racecheck on one short CUDA test; then benches/workloads.rs --quick at
#    T = 1, 2, 4, 8, 16.
#
# GPU_CHECK_BUDGET (seconds, default 460) bounds the whole run.
#
# Writes OUT/report.md (one line per step: passed, failed or timed out, and
# the figure it printed), OUT/run.log (every step's full output) and
# OUT/workloads.json. Exits non-zero if any step did not pass. Where there is
# no GPU (a dry run) every GPU step fails within seconds, and the CPU-only
# workloads bench is not run.
set -uo pipefail
KIT="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:?usage: run.sh OUT_FOLDER}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
REPORT="$OUT/report.md"
LOG="$OUT/run.log"
START=$SECONDS
# The whole run's bound (seconds): a step gets its own bound or what is left
# of this, whichever is less; one with under 5 seconds left is not run.
BUDGET="${GPU_CHECK_BUDGET:-460}"
: > "$LOG"
FAILED=0

{
  echo "# depflow GPU check"
  echo
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname); kit: $(sed -n 2p "$KIT/MANIFEST.md" 2>/dev/null)"
  echo
} > "$REPORT"

log() { printf '%s\n' "$*" >> "$LOG"; }
say() { printf '%s\n' "$*" | tee -a "$LOG"; }

# step NAME SECONDS CHECK COMMAND...: runs COMMAND with a time bound, its
# output into the log; CHECK is a function given the output file and the exit
# status that prints "passed|failed|timed out<TAB>figure".
step() {
  local name="$1" secs="$2" check="$3"; shift 3
  local out="$OUT/.step.out" t0=$SECONDS rc verdict figure
  local left=$((START + BUDGET - SECONDS))
  if [ "$left" -lt 5 ]; then
    not_run "$name" "out of time (the run's bound is ${BUDGET}s)" fails
    return
  fi
  [ "$secs" -gt "$left" ] && secs=$left
  log ""; log "==== $name (at most ${secs}s): $*"
  timeout -k 5 "$secs" "$@" > "$out" 2>&1
  rc=$?
  cat "$out" >> "$LOG"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    verdict="timed out"; figure="after ${secs}s; last line: $(tail -n 1 "$out" | cut -c1-160)"
  else
    IFS=$'\t' read -r verdict figure < <("$check" "$out" "$rc")
  fi
  [ "$verdict" = passed ] || FAILED=1
  log "==== $name: $verdict ($((SECONDS - t0))s, exit $rc) $figure"
  printf '| %s | %s | %ss | %s |\n' "$name" "$verdict" "$((SECONDS - t0))" "${figure//|/\\|}" >> "$REPORT"
  printf '%-40s %-10s %4ss  %s\n' "$name" "$verdict" "$((SECONDS - t0))" "$figure"
  rm -f "$out"
}

# Not run (no GPU, no tool): a line in the report, counted as not passed
# where the step needs a GPU.
not_run() {
  local name="$1" why="$2" counts="$3"
  [ "$counts" = fails ] && FAILED=1
  local verdict="not run"; [ "$counts" = fails ] && verdict="failed"
  printf '| %s | %s | 0s | %s |\n' "$name" "$verdict" "$why" >> "$REPORT"
  printf '%-40s %-10s %4ss  %s\n' "$name" "$verdict" 0 "$why"
  log "==== $name: $verdict: $why"
}

# ---- checks: print "verdict<TAB>figure" ----

# A Rust test binary: passed if it exited 0 and reported no SKIPPED test;
# the figure is libtest's result line(s), and the first failure's message.
tests_check() {
  local out="$1" rc="$2" summary first
  summary="$(grep -E '^test result:' "$out" | sed 's/; finished in.*//' | sort | uniq -c | sed 's/^ *//' | paste -sd ';' -)"
  first="$( { grep -m1 -E 'DEPFLOW_REQUIRE_GPU=1, but' "$out" ||
             grep -m1 -A1 -E 'panicked at' "$out" || grep -m1 -iE 'error' "$out"; } | paste -sd ' ' - | cut -c1-240)"
  if [ "$rc" -eq 0 ] && ! grep -q '^SKIPPED' "$out"; then
    printf 'passed\t%s\n' "$summary"
  elif [ "$rc" -eq 0 ]; then
    printf 'failed\tskipped: %s\n' "$(grep -m1 '^SKIPPED' "$out" | cut -c1-200)"
  else
    printf 'failed\texit %s; %s; first: %s\n' "$rc" "$summary" "$first"
  fi
}

# An example or bench: passed if it exited 0 and did not fall back to the
# simulated GPU; the figure is its lines that carry numbers.
figures_check() {
  local out="$1" rc="$2" figs
  figs="$(grep -E "$FIGURES" "$out" | cut -c1-220 | paste -sd ';' -)"
  if [ "$rc" -ne 0 ]; then
    printf 'failed\texit %s; %s\n' "$rc" "$(tail -n 2 "$out" | paste -sd ' ' - | cut -c1-220)"
  elif grep -qiE 'simulated GPU|\[sim\]' "$out"; then
    printf 'failed\tran on the simulated GPU, not CUDA: %s\n' "$(grep -m1 -iE 'simulated|\[sim\]' "$out" | cut -c1-200)"
  else
    printf 'passed\t%s\n' "$figs"
  fi
}

# compute-sanitizer: passed if it reports no errors.
sanitizer_check() {
  local out="$1" rc="$2" line
  line="$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out")"
  if [ "$rc" -eq 0 ] && grep -qE '(ERROR|RACECHECK) SUMMARY: 0 ' "$out"; then
    printf 'passed\t%s\n' "$line"
  else
    printf 'failed\texit %s; %s\n' "$rc" "${line:-$(tail -n 1 "$out" | cut -c1-200)}"
  fi
}

# The cross-lane test of the debug build must pass (its child, run with the
# wait stubbed out, saw the consumer run first).
crosslane_check() { tests_check "$@"; }

workloads_check() {
  local out="$1" rc="$2"
  if [ "$rc" -eq 0 ] && [ -s "$OUT/workloads.json" ]; then
    printf 'passed\t%s\n' "$(wc -c < "$OUT/workloads.json") bytes of JSON in workloads.json"
  else
    printf 'failed\texit %s; %s\n' "$rc" "$(tail -n 1 "$out" | cut -c1-200)"
  fi
}

# ---- 1. the machine ----
say "== the machine"
HAVE_GPU=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >> "$LOG" 2>&1; then
  HAVE_GPU=1
  nvidia-smi >> "$LOG" 2>&1
  GPU_LINE="$(nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
  CUDA_LINE="$(nvidia-smi 2>/dev/null | grep -oE 'CUDA Version: [0-9.]+' | head -n 1)"
else
  GPU_LINE="no GPU: nvidia-smi $(command -v nvidia-smi >/dev/null && echo 'lists no device' || echo 'not found')"
  CUDA_LINE=""
fi
say "gpu: $GPU_LINE; $CUDA_LINE"
{ echo "toolkits: $(ls -d /usr/local/cuda* 2>/dev/null | paste -sd ' ' -)"
  command -v nvcc >/dev/null && nvcc --version | tail -n 2
  python3 -m pip list 2>/dev/null | grep -iE '^(nvidia|torch)' ; } >> "$LOG" 2>&1
echo "- GPU: $GPU_LINE; driver's $CUDA_LINE" >> "$REPORT"

# Where the libraries are: the loader's cache, the toolkit, Python wheels.
SITES="$(python3 -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null || true)"
SEARCH=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/lib64)
for d in /usr/local/cuda-*/lib64; do [ -d "$d" ] && SEARCH+=("$d"); done
while read -r s; do [ -n "$s" ] && [ -d "$s/nvidia" ] && SEARCH+=("$s/nvidia"); done <<< "$SITES"
# find_lib NAME PATTERN...: the first match, the loader's cache first for the
# driver (never a stub), the toolkit before wheels for the rest.
find_lib() {
  local name="$1"; shift
  local p hit
  if [ "$name" = cuda ]; then
    hit="$(ldconfig -p 2>/dev/null | grep -E 'libcuda\.so\.1 ' | grep -v stubs | head -n 1 | sed 's/.*=> //')"
    [ -n "$hit" ] && { echo "$hit"; return; }
  fi
  local d
  for p in "$@"; do
    for d in "${SEARCH[@]}"; do
      hit="$(find "$d" -maxdepth 4 -name "$p" 2>/dev/null | grep -v stubs | sort -V | head -n 1)"
      [ -n "$hit" ] && { echo "$hit"; return; }
    done
  done
}
# Outside OUT: only plain files come back from a GPU session.
LIBDIR="$(mktemp -d)"
trap 'rm -rf "$LIBDIR"' EXIT
LIB_REPORT=""
for spec in "cuda:libcuda.so.1" "nvrtc:libnvrtc.so.13*:libnvrtc.so.12*:libnvrtc.so" \
            "cublas:libcublas.so.13*:libcublas.so.12*:libcublas.so" "nccl:libnccl.so.2*:libnccl.so"; do
  IFS=: read -r name pats <<< "$spec"
  IFS=: read -r -a patterns <<< "$pats"
  path="$(find_lib "$name" "${patterns[@]}")"
  if [ -n "$path" ]; then
    real="$(readlink -f "$path")"
    # cudarc opens lib<name>.so first: link that name to what was found
    # (NVRTC 13 and the NCCL wheel ship only .so.13 / .so.2, names cudarc
    # built for CUDA 12 does not try). NVRTC's builtins must sit beside it.
    ln -sf "$real" "$LIBDIR/lib$name.so"
    for b in "$(dirname "$real")"/libnvrtc-builtins*.so*; do
      [ "$name" = nvrtc ] && [ -e "$b" ] && ln -sf "$b" "$LIBDIR/"
    done
    LIB_REPORT+="lib$name: $real; "
  else
    LIB_REPORT+="lib$name: not found; "
  fi
done
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "libraries: $LIB_REPORT"
echo "- libraries (linked as lib<name>.so in a folder first on LD_LIBRARY_PATH): $LIB_REPORT" >> "$REPORT"
SANITIZER="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1 || true)"
echo "- compute-sanitizer: ${SANITIZER:-not found}; host: $(nproc) cores" >> "$REPORT"
{ echo; echo "| step | result | time | figure |"; echo "| --- | --- | --- | --- |"; } >> "$REPORT"

export DEPFLOW_REQUIRE_GPU=1
B="$KIT/bin"
# On a dry run (no GPU) every GPU step must fail fast.
short() { if [ "$HAVE_GPU" = 1 ]; then echo "$1"; else echo 20; fi; }

# ---- 2. the tests ----
say "== tests (DEPFLOW_REQUIRE_GPU=1)"
# Its fake-driver tests build a libcuda.so with cc, which a GPU machine may
# lack; they check the no-GPU messages, which CI runs.
step "tests/cuda.rs" "$(short 90)" tests_check "$B/test-cuda" \
  --skip a_stub_driver_library_is_named_in_the_skip \
  --skip driver_codes_are_named_by_number_even_where_cudarc_s_enum_lacks_them
step "tests/nccl.rs" "$(short 60)" tests_check "$B/test-nccl"
step "tests/differential.rs" "$(short 90)" tests_check "$B/test-differential"
step "cross-lane test fails without the wait (debug)" "$(short 60)" crosslane_check \
  "$B/test-cuda-debug" --exact the_cross_lane_test_fails_without_the_cross_lane_wait
for t in streams graph_capture graph_device_memory graph_streams; do
  step "tests/$t.rs" "$(short 30)" tests_check "$B/test-$t"
done

# ---- 3. examples and benches ----
say "== examples and benches"
FIGURES='pipelined|stages alone|check|hand-off|overlap|host threads|accuracy|identical'
step "examples/gpu_pipeline.rs" "$(short 45)" figures_check "$B/example-gpu_pipeline"
step "examples/data_parallel.rs --cuda" "$(short 60)" figures_check \
  "$B/example-data_parallel" --cuda --epochs 5
step "benches/gpu.rs" "$(short 90)" figures_check "$B/bench-gpu"
# ---- 5. compute-sanitizer ----
SHORT_TEST=a_host_function_error_fails_the_op_and_poisons
if [ -z "$SANITIZER" ]; then
  not_run "compute-sanitizer memcheck" "compute-sanitizer not found" ok
elif [ "$HAVE_GPU" = 0 ]; then
  not_run "compute-sanitizer memcheck" "no GPU" fails
else
  step "compute-sanitizer memcheck" 60 sanitizer_check \
    "$SANITIZER" --tool memcheck --target-processes all "$B/test-cuda" --exact a_consumer_on_another_lane_waits_for_its_producer_on_the_device --test-threads 1
  step "compute-sanitizer racecheck" 60 sanitizer_check \
    "$SANITIZER" --tool racecheck --target-processes all "$B/test-cuda" --exact a_consumer_on_another_lane_waits_for_its_producer_on_the_device --test-threads 1
fi

if [ "$HAVE_GPU" = 1 ]; then
  step "benches/workloads.rs --quick T=1,2,4,8,16" 120 workloads_check \
    bash -c '"$0" --quick --runs 1 --threads 1,2,4,8,16 --json > "$1"' \
    "$B/bench-workloads" "$OUT/workloads.json"
else
  not_run "benches/workloads.rs --quick T=1,2,4,8,16" "no GPU machine: not run on a dry run" ok
fi

say ""
say "done in $((SECONDS - START))s: $( [ "$FAILED" = 0 ] && echo 'every step passed' || echo 'some steps did not pass') (report: $REPORT)"
echo >> "$REPORT"
echo "Done in $((SECONDS - START))s; full output in run.log." >> "$REPORT"
exit "$FAILED"
