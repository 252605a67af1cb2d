#!/usr/bin/env bash
# Bounded fuzzing: builds the libFuzzer targets with clang in a build dir of their own
# (build-fuzz: the parsers under test and the job loader, instrumented with ASan+UBSan+coverage;
# tests/fuzz/CMakeLists.txt), replays each target's checked-in corpus (tests/fuzz/corpus/<seeds>/,
# where every reproducer of a past failure is kept) and then explores for N seconds, JOBS targets
# at a time. Exits non-zero if any target finds a crash, hang, leak or sanitizer report; the
# reproducer lands in build-fuzz/artifacts/ (keep it in the corpus, named regress-*, with the fix).
#
#   scripts/fuzz.sh [SECONDS=30]
#   env: CXX_FUZZ (default clang++-14), FUZZ_BUILD_DIR, JOBS (default: the cores), FUZZ_TARGETS
set -uo pipefail

# The targets, each with its seed corpus (tests/fuzz/corpus/SEEDS) and dictionary
# (tests/fuzz/SEEDS.dict). A new target: one line here, one thetad_add_fuzzer in tests/fuzz/.
TARGETS="
fuzz_npy_header         npy
fuzz_job_config         job
fuzz_manifest           manifest
fuzz_shard_index        shard
fuzz_safetensors_header safetensors
fuzz_pt_file            pt
"

secs=${1:-30}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
cxx=${CXX_FUZZ:-clang++-14}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
targets=${FUZZ_TARGETS:-$(awk 'NF {print $1}' <<<"$TARGETS" | paste -sd' ')}

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz.sh: $cxx not found (Debian: apt-get install clang-14)" >&2
  exit 1
fi
declare -A seeds
for target in $targets; do
  seeds[$target]=$(awk -v t="$target" '$1 == t {print $2}' <<<"$TARGETS")
  [ -n "${seeds[$target]}" ] || { echo "fuzz.sh: unknown target $target (not in TARGETS)" >&2; exit 1; }
done

# Libraries get coverage instrumentation without libFuzzer's main; the targets add it.
mkdir -p "$build"
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$san" -DTHETAD_FUZZ=ON -DTHETAD_ENABLE_CUDA=OFF >"$build/configure.log" 2>&1 \
  || { cat "$build/configure.log" >&2; echo "fuzz.sh: configure failed" >&2; exit 1; }
# shellcheck disable=SC2086
cmake --build "$build" --target $targets -j"$jobs" || { echo "fuzz.sh: build failed" >&2; exit 1; }

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$build/artifacts"

# fuzz TARGET: runs it for $secs s (new inputs go to a scratch corpus in the build dir; the
# checked-in seeds are read only), then prints its last lines and verdict.
fuzz() {
  local target=$1 work=$build/corpus/${seeds[$1]} rc=0
  mkdir -p "$work"
  # The checked-in corpus holds every input that ever failed: each is replayed first, whole (the
  # exploring run below also runs the corpus before mutating, but cut to -max_len).
  if ! "$build/tests/fuzz/$target" -timeout=5 -rss_limit_mb=2048 -artifact_prefix="$build/artifacts/$target-replay-" \
       "$root/tests/fuzz/corpus/${seeds[$target]}"/* >"$build/$target-replay.log" 2>&1; then
    { echo "== $target: replaying tests/fuzz/corpus/${seeds[$target]}"; tail -n 25 "$build/$target-replay.log"
      echo "fuzz.sh: $target FAILED on a checked-in input; see $build/$target-replay.log"; } >"$build/$target.verdict"
    return 1
  fi
  "$build/tests/fuzz/$target" "$work" "$root/tests/fuzz/corpus/${seeds[$target]}" \
    -dict="$root/tests/fuzz/${seeds[$target]}.dict" -max_total_time="$secs" -timeout=5 -rss_limit_mb=2048 \
    -max_len=4096 -print_final_stats=1 -artifact_prefix="$build/artifacts/$target-" \
    >"$build/$target.log" 2>&1 || rc=$?
  { echo "== $target: ${secs}s"; tail -n 25 "$build/$target.log"
    if [ $rc -ne 0 ]; then
      echo "fuzz.sh: $target FAILED (exit $rc); see $build/$target.log and $build/artifacts/"
    else
      echo "fuzz.sh: $target: no crash in ${secs}s"
    fi; } >"$build/$target.verdict"
  return $rc
}

# JOBS targets at a time: each fuzzer is one process on one core.
status=0
running=0
for target in $targets; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || status=1
    running=$((running - 1))
  fi
  fuzz "$target" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || status=1
  running=$((running - 1))
done
for target in $targets; do cat "$build/$target.verdict"; done
exit $status
