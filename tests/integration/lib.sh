# The integration scripts' helpers: the shell tests' one library (tests/lib/test_lib.sh: $WORK,
# pass/fail/skip/die/finish, wait_for, expect_code, expect_in, MPIRUN_FLAGS), and helpers that
# read thetad's logs, checkpoints and processes.
# shellcheck shell=bash
# shellcheck source=../lib/test_lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../lib" && pwd)/test_lib.sh"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# skip_without_gpu: ends the test as skipped (ctest: Skipped) where no GPU is visible.
skip_without_gpu() {
  local ngpu
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  [ "${ngpu:-0}" -ge 1 ] || skip "no GPU visible"
}
final_hash() { grep -o 'final params hash: [0-9a-f]*' "$1" | awk '{print $4}' | tail -1; }
# run_np NAME NP JOB ARGS...: `thetad run JOB` on NP ranks from scratch, expecting exit 0, with its
# checkpoints in $WORK/NAME.ckpt, its metrics in $WORK/NAME.jsonl and its log in $WORK/NAME.log.
# queue_np NAME NP JOB ARGS...: the same run, queued (run_queue below).
fresh_args() { echo "--no-resume --set checkpoint.dir=$WORK/$1.ckpt --set metrics.path=$WORK/$1.jsonl --set log.level=info"; }
run_np() {
  local name=$1 np=$2 job=$3; shift 3
  # shellcheck disable=SC2046  # $WORK holds no blank
  expect_code 0 "$name" mpirun "${MPIRUN_FLAGS[@]}" -np "$np" "$thetad" run "$job" $(fresh_args "$name") "$@"
}
queue_np() {
  local name=$1 np=$2 job=$3; shift 3
  # shellcheck disable=SC2046
  queue "$name" "$np" 0 "$job" $(fresh_args "$name") "$@"
}
# Many runs, few starts (thetad run-jobs, daemon/main.cpp, and thetad_reference --cases: one
# process start per rank for all the runs of a world size, one for all the comparisons, instead
# of one per run, about 1.5 s each on two cores):
#   queue NAME NP CODE ARGS...  a run of `thetad run ARGS` on NP ranks that must end CODE on every
#                               rank, its output in $WORK/NAME.log
#   queue_ref NAME CODE ARGS... a comparison `thetad_reference ARGS` (after the runs) that must end
#                               CODE (0: the parameters agree, 1: they do not), its verdict in
#                               $WORK/NAME.log
#   run_queue [MPIRUN_ARGS...]  runs the queue, the runs in order, one start per world size, then
#                               the comparisons in one start, and passes or fails each as
#                               expect_code does; the queue is empty after
# The script's $thetad runs them, and its $reference compares. No word of ARGS may hold a blank.
# Queue runs whose outcome every rank reaches alike: a run that fails on one rank (or is refused
# after start-up, which aborts the job) aborts the list, and the runs after it fail with no exit.
QUEUE=()
queue() {
  local name=$1 np=$2 code=$3 word; shift 3
  for word in "$@"; do [[ $word != *[[:space:]]* ]] || die "queue $name: the word '$word' holds a blank"; done
  QUEUE+=("$np $name $code $*")
}
queue_ref() { local name=$1 code=$2; shift 2; queue "$name" ref "$code" "$@"; }
run_queue() {
  local nps np entry name code args got list
  nps=$(for entry in "${QUEUE[@]}"; do echo "${entry%% *}"; done | awk '$0 != "ref" && !seen[$0]++')
  for np in $nps ref; do
    list=$(mktemp "$WORK/queue.XXXXXX")
    for entry in "${QUEUE[@]}"; do
      read -r _ name code args <<<"$entry"
      [ "${entry%% *}" = "$np" ] || continue
      : > "$WORK/$name.log"
      if [ "$np" = ref ]; then echo "$name $args"; else echo "$WORK/$name.log $args"; fi >> "$list"
    done
    if [ "$np" != ref ]; then
      mpirun "${MPIRUN_FLAGS[@]}" "$@" -np "$np" "$thetad" run-jobs "$list" > "$list.out" 2>&1 || true
    elif [ -s "$list" ]; then
      "$reference" --cases "$list" > "$list.out" 2>&1 || true
      while read -r name _; do grep "^$name " "$list.out" > "$WORK/$name.log" || true; done < "$list"
    fi
  done
  for entry in "${QUEUE[@]}"; do
    read -r np name code _ <<<"$entry"
    if [ "$np" = ref ]; then
      got=$(sed -n -E -e "s/^$name ok: .*/0 x ref/p" -e "s/^$name FAIL: .*/1 x ref/p" "$WORK/$name.log")
    else
      # Not anchored at the line's start: each rank's exit line is one write, but another rank's
      # error text, written in pieces, may have begun the line it lands on.
      got=$(grep -oE "thetad run-jobs: rank [0-9]+ of $np: exit [0-9]+$" "$WORK/$name.log" | sed -E 's/.*: exit //' | sort | uniq -c |
            awk '{printf "%s%s x %s", sep, $2, $1; sep = ", "}')
    fi
    if [ "$got" = "$code x $np" ]; then pass "$name (exit $code)"; else
      fail "$name: exit ${got:-none: the list was aborted}, expected $code ($np)"; tail -15 "$WORK/$name.log"; fi
  done
  QUEUE=()
}
# same_hash WHAT A B: runs A and B (logs in $WORK) ended with bitwise the same parameters.
same_hash() {
  local a b
  a=$(final_hash "$WORK/$2.log"); b=$(final_hash "$WORK/$3.log")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "$1 ($a)"; else fail "$1: $a != $b"; fi
}
# newest DIR: the newest complete checkpoint (step-N with a manifest) in DIR.
newest() { (cd "$1" && ls -d step-*/manifest.json 2>/dev/null | sed 's|/manifest.json||' | sort -t- -k2,2n | tail -1); }
# ranks_of JOB: pids of the thetad processes of a run started with --set job=JOB.
ranks_of() { pgrep -f "thetad run .*job=$1" || true; }
# owner_steps LOG [RANKS...]: the offload store's "N group steps run as owner", added up over
# the given ranks' lines of a merged log (all ranks when none are given).
owner_steps() {
  local log=$1; shift
  local pat='.'
  (($# == 0)) || pat="\\[rank ($(IFS='|'; echo "$*"))\\]"
  grep -E "$pat" "$log" | sed -n -E 's/.*parameter store: ([0-9]+) group steps run as owner.*/\1/p' |
    awk '{s += $1} END {print s + 0}'
}
