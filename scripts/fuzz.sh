#!/usr/bin/env bash
# Bounded fuzzing: builds the libFuzzer targets with clang in a build dir of
# their own (build-fuzz, every library instrumented with ASan+UBSan+coverage), replays each
# target's checked-in corpus (tests/fuzz/corpus/<seeds>/, where every reproducer of a past
# failure is kept) and then explores for N seconds. Exits non-zero if any target finds a crash,
# hang, leak or sanitizer report; the reproducer lands in build-fuzz/artifacts/ (keep it in the
# corpus, named regress-*, with the fix).
#
#   scripts/fuzz.sh [SECONDS=30]
#   env: CXX_FUZZ (default clang++-14), FUZZ_BUILD_DIR, JOBS (default 2), FUZZ_TARGETS
set -uo pipefail

secs=${1:-30}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
cxx=${CXX_FUZZ:-clang++-14}
targets=${FUZZ_TARGETS:-"fuzz_npy_header fuzz_job_config fuzz_manifest fuzz_shard_index fuzz_safetensors_header fuzz_pt_file"}

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz.sh: $cxx not found (Debian: apt-get install clang-14)" >&2
  exit 1
fi

# Libraries get coverage instrumentation without libFuzzer's main; the targets add it.
mkdir -p "$build"
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$san" -DTHETAD_FUZZ=ON -DTHETAD_ENABLE_CUDA=OFF >"$build/configure.log" 2>&1 \
  || { cat "$build/configure.log" >&2; echo "fuzz.sh: configure failed" >&2; exit 1; }
# shellcheck disable=SC2086
cmake --build "$build" --target $targets -j"${JOBS:-2}" || { echo "fuzz.sh: build failed" >&2; exit 1; }

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$build/artifacts"
status=0
for target in $targets; do
  case $target in
    fuzz_npy_header) seeds=npy ;;
    fuzz_job_config) seeds=job ;;
    fuzz_manifest) seeds=manifest ;;
    fuzz_shard_index) seeds=shard ;;
    fuzz_safetensors_header) seeds=safetensors ;;
    fuzz_pt_file) seeds=pt ;;
    *) echo "fuzz.sh: unknown target $target" >&2; exit 1 ;;
  esac
  # The checked-in corpus holds every input that ever failed: each is replayed first, whole (the
  # exploring run below also runs the corpus before mutating, but cut to -max_len).
  echo "== $target: replaying tests/fuzz/corpus/$seeds"
  if ! "$build/tests/fuzz/$target" -timeout=5 -rss_limit_mb=2048 -artifact_prefix="$build/artifacts/$target-replay-" \
    "$root/tests/fuzz/corpus/$seeds"/* \
    >"$build/$target-replay.log" 2>&1; then
    tail -n 25 "$build/$target-replay.log"
    echo "fuzz.sh: $target FAILED on a checked-in input; see $build/$target-replay.log" >&2
    status=1
    continue
  fi
  # New inputs go to a scratch corpus in the build dir; the checked-in seeds are read only.
  work="$build/corpus/$seeds"
  mkdir -p "$work"
  echo "== $target: ${secs}s"
  "$build/tests/fuzz/$target" "$work" "$root/tests/fuzz/corpus/$seeds" \
    -dict="$root/tests/fuzz/$seeds.dict" -max_total_time="$secs" -timeout=5 -rss_limit_mb=2048 \
    -max_len=4096 -print_final_stats=1 -artifact_prefix="$build/artifacts/$target-" \
    >"$build/$target.log" 2>&1
  rc=$?
  tail -n 25 "$build/$target.log"
  if [ $rc -ne 0 ]; then
    echo "fuzz.sh: $target FAILED (exit $rc); see $build/$target.log and $build/artifacts/" >&2
    status=1
  else
    echo "fuzz.sh: $target: no crash in ${secs}s"
  fi
done
exit $status
