#!/usr/bin/env bash
# Launcher behaviour with a FAKE thetad (fake_thetad.sh) under real mpirun: job checked first,
# exit codes and the failing rank named, per-rank and merged logs, SIGTERM/SIGINT forwarding,
# a lost rank, the flags it gives mpirun. Usage: launcher_fake.sh CASE (see the case list below).
set -euo pipefail
# shellcheck source=tests/launch/fake_run.sh
source "$(dirname "$0")/fake_run.sh"

case_bad_job() {
  local job; job=$(make_job bad 'model: {kind: FAKE_INVALID}')
  mpirun_shim
  THETAD_MPIRUN=$T/mpirun-shim run_launcher "$T/bad" --log-dir "$T/logs" "$job" --set steps=5
  ((RC == 2)) || { cat "$T/bad.err" >&2; fail "bad job: want exit 2, got $RC"; }
  [[ ! -e $T/mpirun-started ]] || fail "mpirun was started for an invalid job"
  [[ ! -e $THETAD_FAKE_STATE/ran ]] || fail "a worker ran for an invalid job"
  assert_grep 'FAKE_INVALID' "$T/bad.err" "validate's message not shown"
  assert_grep 'invalid|nothing was started' "$T/bad.err"
  # A thetad that cannot run at all is not a job error: exit 1, and the message says so.
  local job2; job2=$(make_job broken)
  touch "$T/not-executable"
  RC=0
  THETAD_MPIRUN=$T/mpirun-shim timeout -k 5 60 "$LAUNCHER" --thetad "$T/not-executable" --log-dir "$T/logs" "$job2" >"$T/broken.out" 2>"$T/broken.err" || RC=$?
  ((RC == 1)) || { cat "$T/broken.err" >&2; fail "thetad not executable: want exit 1, got $RC"; }
  [[ ! -e $T/mpirun-started ]] || fail "mpirun was started although thetad cannot run"
  assert_grep 'is not an executable file' "$T/broken.err"
  pass "invalid job: exit 2, mpirun never started"
}

# The ranks read the bytes the launcher checked (--checked-copy in the log dir), not the job file
# again: an edit after the check does not reach them.
case_checked_bytes() {
  local job r copy; job=$(make_job checked)
  cp "$job" "$T/checked.orig"
  THETAD_FAKE_EDIT_JOB=1 run_launcher "$T/checked" --nproc-per-node 2 --log-dir "$T/logs" "$job"
  ((RC == 0)) || { cat "$T/checked.err" >&2; fail "checked bytes: want exit 0, got $RC"; }
  ! cmp -s "$job" "$T/checked.orig" || fail "the fake did not edit the job file"
  for r in 0 1; do
    copy=$(grep -A1 -x -- '--checked-copy' "$THETAD_FAKE_STATE/args-$r" | tail -1)
    [[ -n $copy && $copy != --checked-copy ]] || fail "rank $r got no --checked-copy: $(tr '\n' ' ' <"$THETAD_FAKE_STATE/args-$r")"
    cmp -s "$copy" "$T/checked.orig" || fail "rank $r's copy ($copy) is not the job as checked"
  done
  pass "the ranks read the job's checked bytes; an edit after the check does not reach them"
}

case_rank_fails() {
  local job; job=$(make_job fail)
  THETAD_FAKE_STEPS=50 THETAD_FAKE_EXIT_RANK=1 THETAD_FAKE_EXIT_CODE=3 THETAD_FAKE_EXIT_AFTER=2 \
    run_launcher "$T/fail" --nproc-per-node 2 --log-dir "$T/logs" "$job"
  ((RC == 3)) || { cat "$T/fail.err" >&2; fail "rank 1 exits 3: want launcher exit 3, got $RC"; }
  assert_grep 'rank 1 exited with code 3' "$T/fail.err" "summary does not name rank 1"
  [[ $(cut -d' ' -f1 "$T/logs/rank-1.exit") == 3 ]] || fail "rank-1.exit does not say 3"
  no_leftovers
  pass "rank 1 exits 3: launcher exits 3 and names rank 1"
}

case_logs() {
  local job; job=$(make_job logs)
  mkdir -p "$T/cwd"
  (cd "$T/cwd" && THETAD_FAKE_STEPS=3 run_launcher "$T/logs" --nproc-per-node 2 "$job" --log-level info
   echo "$RC" >"$T/rc")
  RC=$(cat "$T/rc")
  ((RC == 0)) || { cat "$T/logs.err" >&2; fail "clean run: want exit 0, got $RC"; }
  local dir=$T/cwd/runs/logs-$MARKER/logs r
  for r in 0 1; do
    [[ -s $dir/rank-$r.log ]] || fail "no $dir/rank-$r.log (default log dir from the job name)"
    assert_grep "\[rank $r\] \[daemon\] info: step 3" "$dir/rank-$r.log"
    assert_grep "^untagged line from fake rank $r\$" "$dir/rank-$r.log" "rank file should keep raw lines"
    assert_grep "^\[rank $r\] untagged line from fake rank $r\$" "$T/logs.err" "merged stream: untagged line of rank $r not tagged"
    assert_grep "\[rank $r\] \[daemon\] info: done" "$T/logs.err"
    [[ $(cut -d' ' -f1 "$dir/rank-$r.exit") == 0 ]] || fail "rank-$r.exit is not 0"
  done
  assert_no_grep '\[rank [0-9]+\] \[[0-9]{4}-' "$T/logs.err" "lines tagged twice"
  assert_grep 'all 2 rank\(s\) finished' "$T/logs.err"
  # --log-level reached the workers as a run option
  assert_grep 'starts: .* run .*--log-level info' "$dir/rank-0.log"
  no_leftovers
  pass "per-rank logs and merged tagged stream"
}

# ranks_stopped LOGDIR PATTERN: ranks 0 and 1 each logged PATTERN and recorded exit 4.
ranks_stopped() {
  local r
  for r in 0 1; do
    assert_grep "$2" "$1/rank-$r.log" "rank $r: no /$2/ in its log"
    [[ $(cut -d' ' -f1 "$1/rank-$r.exit") == 4 ]] || fail "rank $r did not exit 4"
  done
}

sig_case() {  # sig_case TERM|INT [bg]
  local sig=$1 job; job=$(make_job "sig$sig")
  # Job control gives the background launcher its own process group and leaves SIGINT
  # deliverable. With "bg", no job control: the launcher starts with SIGINT ignored, as
  # `thetad-launch job.yaml &` in a script does, and must still honour it.
  [[ ${2:-} == bg ]] || set -m
  THETAD_FAKE_STEPS=600 THETAD_FAKE_SLEEP=0.1 \
    start_launcher "$T/sig" --nproc-per-node 2 --log-dir "$T/logs" "$job"
  set +m
  wait_for 30 test -e "$THETAD_FAKE_STATE/pid-0"
  wait_for 30 test -e "$THETAD_FAKE_STATE/pid-1"
  sleep 0.5
  kill "-$sig" "$LPID"
  wait_exit "$LPID" 30
  ((RC == 4)) || { cat "$T/sig.err" >&2; fail "SIG$sig: want launcher exit 4, got $RC"; }
  ranks_stopped "$T/logs" 'got SIGTERM'
  assert_grep 'exited with code 4 \(interrupted' "$T/sig.err"
  no_leftovers
  pass "SIG$sig to the launcher: every worker got SIGTERM and exited 4; launcher exit 4 in ${ELAPSED}s"
}

# launcher_catches PID SIG: the launcher program runs (exec'd by the wrapper) and catches SIG (its
# SigCgt mask). The program itself, not its command line: the wrapper's sh also shows SIGINT as
# caught (dash catches it while it runs a script) and ends with 130 on it.
launcher_catches() {
  local bit key val exe
  bit=$((1 << ($(kill -l "$2") - 1)))
  exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
  [[ ${exe##*/} == thetad-launch ]] || return 1
  while read -r key val _; do
    [[ $key == SigCgt: ]] && (((0x$val & bit) != 0)) && return 0
  done <"/proc/$1/status"
  return 1
}

# A stop signal early on: before the ranks start (during validate), just after mpirun started,
# and while the ranks' thetad is still loading (no SIGTERM handler yet: THETAD_FAKE_START_DELAY).
# Always exit 4, never a rank lost, never a job run to its end.
case_early_stop() {
  local sig when job n=0 r started
  for sig in TERM INT; do
    for when in 0 0.4 ranks; do
      n=$((n + 1))
      job=$(make_job "early$n")
      rm -f "$THETAD_FAKE_STATE"/*
      set -m
      THETAD_FAKE_STEPS=600 THETAD_FAKE_SLEEP=0.1 THETAD_FAKE_START_DELAY=1.5 \
        start_launcher "$T/early$n" --nproc-per-node 2 --log-dir "$T/logs$n" "$job"
      set +m
      wait_for 10 launcher_catches "$LPID" "$sig"
      if [[ $when == ranks ]]; then
        wait_for 30 test -e "$THETAD_FAKE_STATE/pid-0"
      else
        sleep "$when"
      fi
      kill "-$sig" "$LPID"
      wait_exit "$LPID" 30
      ((RC == 4)) || { cat "$T/early$n.err" >&2; fail "SIG$sig at $when: want exit 4, got $RC"; }
      assert_no_grep 'No such file|line [0-9]+:' "$T/early$n.err" "SIG$sig at $when: shell errors"
      if [[ $when == ranks ]]; then
        for r in 0 1; do
          assert_grep 'got SIGTERM' "$T/logs$n/rank-$r.log" "SIG$sig at $when: rank $r did not get SIGTERM"
          [[ $(cut -d' ' -f1 "$T/logs$n/rank-$r.exit") == 4 ]] || fail "SIG$sig at $when: rank $r did not exit 4"
        done
      fi
      for r in "$T/logs$n"/rank-*.log; do
        [[ -e $r ]] || continue
        assert_no_grep 'info: done' "$r" "SIG$sig at $when: the job ran to its end"
      done
      no_leftovers
      started=("$T/logs$n"/rank-*.exit)
      [[ -e ${started[0]} ]] || started=()
      echo "SIG$sig at $when: exit 4 (${#started[@]} rank(s) had started)"
    done
  done
  pass "a stop signal early on: exit 4 each time"
}

# A storm of stop signals from the launcher's first trapped moment on, through validation and the
# ranks' start: every run exits 4, and never with a broken trap (exit 2, "unexpected EOF": bash
# 5.2 running a trap while it parses a substitution; 1 of 8 early_stop runs under load before).
case_startup_storm() {
  local job i rc bad=0
  job=$(make_job sstorm)
  for ((i = 0; i < 6; i++)); do
    rm -f "$THETAD_FAKE_STATE"/*
    set -m
    THETAD_FAKE_STEPS=600 THETAD_FAKE_SLEEP=0.1 THETAD_FAKE_START_DELAY=0.5 \
      start_launcher "$T/sstorm$i" --nproc-per-node 2 --log-dir "$T/slogs$i" "$job"
    set +m
    wait_for 10 launcher_catches "$LPID" TERM
    while kill -TERM "$LPID" 2>/dev/null; do
      [[ -e $THETAD_FAKE_STATE/pid-1 ]] && break
      sleep 0.00$((RANDOM % 5))
    done
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -TERM "$LPID" 2>/dev/null || break; sleep 0.01; done
    wait_exit "$LPID" 30
    rc=$RC
    if ((rc != 4)) || grep -q -E 'unexpected EOF|syntax error|line [0-9]+:' "$T/sstorm$i.err"; then
      bad=$((bad + 1))
      { echo "storm $i: exit $rc"; tail -n 5 "$T/sstorm$i.err"; } >&2
    fi
  done
  ((bad == 0)) || fail "$bad of 6 launchers stormed with SIGTERM from their start did not exit 4 cleanly"
  no_leftovers
  pass "6 launchers stormed with SIGTERM from their first trapped moment to the ranks' start: each exited 4"
}

# start_checkpointing_ranks NAME STOP_SLEEP: the launcher (own process group, $LPID) with 2 fake
# ranks whose checkpoint takes STOP_SLEEP seconds, both running.
start_checkpointing_ranks() {
  local job; job=$(make_job "$1")
  set -m
  THETAD_FAKE_STEPS=600 THETAD_FAKE_SLEEP=0.1 THETAD_FAKE_STOP_SLEEP=$2 \
    start_launcher "$T/$1" --nproc-per-node 2 --log-dir "$T/logs" "$job"
  set +m
  wait_for 30 test -e "$THETAD_FAKE_STATE/pid-1"
  sleep 0.5
}

# A second and third stop signal while the ranks checkpoint change nothing.
case_stop_twice() {
  start_checkpointing_ranks twice 3
  kill -TERM "$LPID"
  wait_for 10 grep -q 'got SIGTERM' "$T/logs/rank-0.log"
  wait_for 10 grep -q 'got SIGTERM' "$T/logs/rank-1.log"
  kill -TERM "$LPID"
  sleep 0.3
  kill -INT "$LPID"
  wait_exit "$LPID" 30
  ((RC == 4)) || { cat "$T/twice.err" >&2; fail "stop signals while stopping: want exit 4, got $RC"; }
  ranks_stopped "$T/logs" 'checkpoint complete'
  assert_grep 'already stopping' "$T/twice.err"
  no_leftovers
  pass "repeated stop signals while stopping: checkpoints complete, exit 4"
}

# Bad --log-level and --hosts values: exit 2 naming the option, nothing started.
case_bad_args() {
  local job spec; job=$(make_job badargs)
  mpirun_shim
  export THETAD_MPIRUN=$T/mpirun-shim
  run_launcher "$T/lvl" --log-dir "$T/logs" "$job" --log-level loud
  ((RC == 2)) || { cat "$T/lvl.err" >&2; fail "--log-level loud: want exit 2, got $RC"; }
  assert_grep "--log-level: unknown level 'loud'" "$T/lvl.err"
  run_launcher "$T/lvl" --log-dir "$T/logs" "$job" --log-level
  ((RC == 2)) || fail "--log-level without a value: want exit 2, got $RC"
  for spec in :2 a:0 a:x a: 'a:2,' 'a,,b' ',a' 'a:2:3' 'a b:2' 'a:-1'; do
    run_launcher "$T/hosts" --log-dir "$T/logs" --hosts "$spec" "$job"
    ((RC == 2)) || { cat "$T/hosts.err" >&2; fail "--hosts '$spec': want exit 2, got $RC"; }
    assert_grep "error: --hosts " "$T/hosts.err" "--hosts '$spec': message does not name --hosts"
  done
  # One host twice (mpirun makes one node of them, where the plan would count two).
  for spec in a:2,a:2 a,A.cluster:1; do
    run_launcher "$T/hosts" --log-dir "$T/logs" --hosts "$spec" "$job"
    ((RC == 2)) || { cat "$T/hosts.err" >&2; fail "--hosts '$spec': want exit 2, got $RC"; }
    assert_grep "error: --hosts '$spec': entries .* name one host" "$T/hosts.err"
  done
  [[ ! -e $T/mpirun-started ]] || fail "mpirun was started for bad arguments"
  [[ ! -e $THETAD_FAKE_STATE/ran ]] || fail "a worker ran for bad arguments"
  local out lvl
  for lvl in trace debug info warn error critical off; do
    out=$("$LAUNCHER" --thetad "$FAKE" --dry-run --hosts a,b:3 "$job" --log-level "$lvl") ||
      fail "--log-level $lvl refused"
  done
  grep -q -- '-np 5 --host a:2,b:3' <<<"$out" || fail "--hosts a,b:3: $out"
  pass "bad --log-level / --hosts: exit 2 naming the option, nothing started"
}

# Hostfile counts: slots= out of range (atoi once turned 2147483648 into -np -2147483648 and
# 99999999999 into 1215752191 ranks) is exit 2 naming the file and line, nothing started; hosts
# with different slots= run the sum of them.
case_bad_hostfile() {
  local job bad out; job=$(make_job badhosts)
  mpirun_shim
  for bad in 2147483648 0 99999999999 -1 4x; do
    printf '# hosts\nnodeA slots=2\nnodeB slots=%s\n' "$bad" >"$T/hostfile"
    THETAD_MPIRUN=$T/mpirun-shim run_launcher "$T/hf" --log-dir "$T/logs" --hostfile "$T/hostfile" "$job"
    ((RC == 2)) || { cat "$T/hf.out" "$T/hf.err" >&2; fail "slots=$bad: want exit 2, got $RC"; }
    assert_grep "hostfile '$T/hostfile' line 3: slots=$bad is not a whole number from 1 to" "$T/hf.err"
    THETAD_MPIRUN=$T/mpirun-shim run_launcher "$T/hf" --dry-run --hostfile "$T/hostfile" "$job"
    ((RC == 2)) || { cat "$T/hf.out" >&2; fail "slots=$bad, dry run: want exit 2, got $RC"; }
  done
  [[ ! -e $T/mpirun-started ]] || fail "mpirun was started for a bad hostfile"
  [[ ! -e $T/logs ]] || fail "a bad hostfile created the log dir"
  printf 'nodeA slots=2\nnodeB slots=3\n' >"$T/hostfile"
  out=$("$LAUNCHER" --thetad "$FAKE" --dry-run --hostfile "$T/hostfile" "$job")
  grep -q -- '-np 5 --hostfile' <<<"$out" || fail "slots=2 and slots=3: want 5 ranks: $out"
  mkfifo "$T/hostfifo"
  run_launcher "$T/hf" --dry-run --hostfile "$T/hostfifo" "$job"
  ((RC == 2)) || fail "a FIFO as hostfile: want exit 2, got $RC"
  assert_grep "hostfile '$T/hostfifo' is not a regular file" "$T/hf.err"
  pass "hostfile slots out of range: exit 2 naming the file and line; uneven slots summed"
}

# The launcher's checks before anything starts are interruptible and never wait on a FIFO: a
# FIFO as the job file is exit 2 at once (it hung until SIGKILL); a SIGTERM while a check is
# stuck (here nvidia-smi, counting the GPUs, answers after 30 s) ends the launcher within
# seconds with exit 4, nothing started, the stuck helper gone with it (it was ignored until the
# check ended).
case_stop_during_check() {
  local job start; job=$(make_job slowcheck)
  mkfifo "$T/fifo.yaml"
  start=$SECONDS
  RC=0
  timeout -k 1 10 "$LAUNCHER" --thetad "$FAKE" --log-dir "$T/logs" "$T/fifo.yaml" >"$T/fifo.out" 2>"$T/fifo.err" || RC=$?
  ((RC == 2)) || { cat "$T/fifo.err" >&2; fail "a FIFO as the job file: want exit 2, got $RC"; }
  assert_grep "job file '$T/fifo.yaml' is not a regular file" "$T/fifo.err"
  mkdir -p "$T/bin"
  cat >"$T/bin/nvidia-smi" <<SMI
#!/usr/bin/env bash
touch "$T/smi-started"
exec sleep 30
SMI
  chmod +x "$T/bin/nvidia-smi"
  mpirun_shim
  local sig
  for sig in TERM INT; do
    rm -f "$T/smi-started"
    set -m
    PATH=$T/bin:$PATH THETAD_MPIRUN=$T/mpirun-shim start_launcher "$T/slow" --nproc-per-node 1 --log-dir "$T/logs" "$job"
    set +m
    wait_for 10 test -e "$T/smi-started"
    start=$SECONDS
    kill "-$sig" "$LPID"
    wait_exit "$LPID" 40
    ((RC == 4)) || { cat "$T/slow.err" >&2; fail "SIG$sig during the check: want exit 4, got $RC"; }
    ((SECONDS - start <= 5)) || fail "SIG$sig during the check: exit after $((SECONDS - start)) s (want at once)"
    assert_grep "SIG$sig: stopped before any rank started" "$T/slow.err"
  done
  [[ ! -e $T/mpirun-started ]] || fail "mpirun was started after a stop during the check"
  no_leftovers
  pass "FIFO job file: exit 2 at once; SIGTERM/SIGINT during a stuck check: exit 4 at once, nothing left"
}

case_kill9() {
  local job; job=$(make_job kill9)
  THETAD_FAKE_STEPS=3000 THETAD_FAKE_SLEEP=0.1 \
    start_launcher "$T/k9" --nproc-per-node 2 --log-dir "$T/logs" "$job"
  wait_for 30 test -e "$THETAD_FAKE_STATE/pid-0"
  wait_for 30 test -e "$THETAD_FAKE_STATE/pid-1"
  sleep 0.5
  kill -KILL "$(cat "$THETAD_FAKE_STATE/pid-1")"
  wait_exit "$LPID" 30
  ((RC != 0)) || fail "kill -9 of rank 1: launcher exited 0"
  ((RC == 3)) || { cat "$T/k9.err" >&2; fail "kill -9 of rank 1: want exit 3, got $RC"; }
  assert_grep 'rank 1 lost \(signal 9' "$T/k9.err" "summary does not name the lost rank"
  local p
  for p in "$THETAD_FAKE_STATE"/pid-*; do
    ! alive "$(cat "$p")" || fail "fake worker $(cat "$p") still alive"
  done
  no_leftovers
  pass "kill -9 of rank 1: launcher exit 3 in ${ELAPSED}s naming rank 1, nothing left"
}

# The wrapper itself (not thetad) is killed: mpirun names the rank, pdeathsig ends its worker.
case_kill9_wrapper() {
  local job; job=$(make_job kill9w)
  THETAD_FAKE_STEPS=3000 THETAD_FAKE_SLEEP=0.1 \
    start_launcher "$T/k9w" --nproc-per-node 2 --log-dir "$T/logs" "$job"
  wait_for 30 test -e "$THETAD_FAKE_STATE/pid-1"
  wait_for 30 test -e "$T/logs/rank-1.pid"
  sleep 0.5
  local wrapper; read -r wrapper _ <"$T/logs/rank-1.pid"
  kill -KILL "$wrapper"
  wait_exit "$LPID" 30
  ((RC == 3)) || { cat "$T/k9w.err" >&2; fail "kill -9 of rank 1's wrapper: want exit 3, got $RC"; }
  assert_grep 'rank 1 lost \(signal 9' "$T/k9w.err" "summary does not name the lost rank"
  no_leftovers
  pass "kill -9 of rank 1's wrapper: launcher exit 3 in ${ELAPSED}s naming rank 1, nothing left"
}

case_flags() {
  local job cores out
  job=$(make_job flags)
  cores=$(nproc)
  out=$("$LAUNCHER" --thetad "$FAKE" --dry-run --nproc-per-node 1 "$job" --set steps=3)
  grep -q -- '-np 1 ' <<<"$out" || fail "dry run: no -np 1: $out"
  ! grep -q -- '--oversubscribe' <<<"$out" || fail "--oversubscribe with 1 rank: $out"
  grep -q -- '--bind-to none' <<<"$out" || fail "CPU-only: want --bind-to none: $out"
  # One node: shared memory only (a TCP BTL listens on every interface), mpirun's channel on lo.
  grep -q -- '--mca btl self,vader --mca oob_tcp_if_include lo ' <<<"$out" || fail "single node: want shared memory only: $out"
  ! grep -q -E -- 'btl [^ ]*tcp|btl_tcp' <<<"$out" || fail "single node: a TCP BTL: $out"
  grep -q -- 'validate .*--set steps=3' <<<"$out" || fail "--set not passed to validate: $out"
  grep -q -- '-x OMP_NUM_THREADS' <<<"$out" || fail "OMP_NUM_THREADS not passed: $out"
  out=$(THETAD_X_TEST=1 NCCL_DEBUG=WARN "$LAUNCHER" --thetad "$FAKE" --dry-run --nproc-per-node $((cores + 1)) "$job")
  grep -q -- '--oversubscribe' <<<"$out" || fail "N > cores: want --oversubscribe: $out"
  grep -q -- '-x NCCL_DEBUG' <<<"$out" || fail "NCCL_* not passed: $out"
  grep -q -- '-x THETAD_X_TEST' <<<"$out" || fail "THETAD_* not passed: $out"
  out=$(THETAD_MPIRUN_ARGS='--mca btl self,tcp' "$LAUNCHER" --thetad "$FAKE" --dry-run "$job")
  ! grep -q -- 'btl self,vader' <<<"$out" || fail "THETAD_MPIRUN_ARGS did not replace the net flags: $out"
  grep -q -- '--mca btl self,tcp' <<<"$out" || fail "THETAD_MPIRUN_ARGS not used: $out"
  grep -q -- '-np 2 ' <<<"$out" || fail "no GPUs: want 2 ranks: $out"
  out=$(CUDA_VISIBLE_DEVICES=0,1,2 "$LAUNCHER" --thetad "$FAKE" --dry-run "$job")
  if ((cores >= 3)); then
    grep -q -- '--map-by ppr:3:node --bind-to numa' <<<"$out" || fail "3 GPUs: want numa binding: $out"
  fi
  grep -q -- '-np 3 ' <<<"$out" || fail "3 visible GPUs: want 3 ranks: $out"
  grep -q -- '-x CUDA_VISIBLE_DEVICES' <<<"$out" || fail "CUDA_VISIBLE_DEVICES not passed: $out"
  grep -q -- '-x NCCL_NVLS_ENABLE' <<<"$out" || fail "NCCL_NVLS_ENABLE=0 not passed on GPUs: $out"
  # NCCL's sockets on loopback where every rank runs on this host; a named interface is kept.
  grep -q -- '-x NCCL_SOCKET_IFNAME' <<<"$out" || fail "one host with GPUs: NCCL_SOCKET_IFNAME=lo not passed: $out"
  local ifname
  for ifname in "" eth9; do  # what the rank sees: lo, or the user's own
    rm -f "$THETAD_FAKE_STATE"/*
    CUDA_VISIBLE_DEVICES=0 NCCL_SOCKET_IFNAME=$ifname THETAD_FAKE_STEPS=1 run_launcher "$T/ifname" --log-dir "$T/ifname-logs" "$job"
    ((RC == 0)) || { cat "$T/ifname.err" >&2; fail "a run on one host with GPUs: want exit 0, got $RC"; }
    [[ $(cat "$THETAD_FAKE_STATE/nccl_socket_ifname-0") == "${ifname:-lo}" ]] ||
      fail "NCCL_SOCKET_IFNAME='$ifname' set: the rank saw '$(cat "$THETAD_FAKE_STATE/nccl_socket_ifname-0")'"
  done
  out=$(CUDA_VISIBLE_DEVICES=0,1 "$LAUNCHER" --thetad "$FAKE" --dry-run --hosts "a:2,b:2" "$job")
  ! grep -q -- '-x NCCL_SOCKET_IFNAME' <<<"$out" || fail "several hosts: NCCL_SOCKET_IFNAME set to lo: $out"
  out=$("$LAUNCHER" --thetad "$FAKE" --dry-run --hosts "a:2,b:2" "$job")
  grep -q -- '-np 4 --host a:2,b:2' <<<"$out" || fail "--hosts: $out"
  printf 'nodeA slots=4\nnodeB slots=4\n' >"$T/hostfile"
  out=$("$LAUNCHER" --thetad "$FAKE" --dry-run --hostfile "$T/hostfile" "$job")
  grep -q -- '-np 8 --hostfile' <<<"$out" || fail "hostfile with slots=4 x 2 hosts: want 8 ranks: $out"
  grep -q -- 'ppr:4:node' <<<"$out" || fail "hostfile: want ppr:4:node: $out"
  out=$(SLURM_JOB_ID=42 SLURM_JOB_NUM_NODES=2 "$LAUNCHER" --thetad "$FAKE" --dry-run "$job")
  grep -q -- '^launch: srun --mpi=pmix' <<<"$out" || fail "inside Slurm: want srun: $out"
  grep -q -- '--worker' <<<"$out" || fail "srun: workers not wrapped: $out"
  # Simulated nodes: N x --nproc-per-node ranks on this host, the variable passed to every rank.
  out=$("$LAUNCHER" --thetad "$FAKE" --dry-run --simulate-nodes 3 --nproc-per-node 2 "$job")
  ! grep -q -E -- 'btl [^ ]*tcp' <<<"$out" || fail "simulated nodes share one host: a TCP BTL: $out"
  grep -q -- '-np 6 .*--bind-to none.*-x THETAD_SIMULATE_NODES' <<<"$out" || fail "--simulate-nodes 3 x 2: $out"
  grep -q -- 'ranks: 6 (3 node(s) x 2)' <<<"$out" || fail "--simulate-nodes 3 x 2: want 3 nodes: $out"
  local rc=0
  "$LAUNCHER" --thetad "$FAKE" --dry-run --simulate-nodes 2 --hosts a:2,b:2 "$job" 2>/dev/null || rc=$?
  ((rc == 2)) || fail "--simulate-nodes with --hosts: want exit 2, got $rc"
  rc=0
  "$LAUNCHER" --thetad "$T/nonexistent" "$job" 2>/dev/null || rc=$?
  ((rc == 1)) || fail "missing thetad: want exit 1, got $rc"
  rc=0; "$LAUNCHER" --thetad "$FAKE" "$T/nonexistent.yaml" 2>/dev/null || rc=$?
  ((rc == 2)) || fail "missing job file: want exit 2, got $rc"
  rc=0; "$LAUNCHER" --bogus 2>/dev/null || rc=$?
  ((rc == 2)) || fail "unknown option: want exit 2, got $rc"
  # No $(...) and no process substitution in the launcher's code (see the note at its top).
  ! grep -n -E '^[^#]*([$<>]\([^(])' "$LAUNCHER" >"$T/substitutions" ||
    fail "the launcher uses \$(...), <(...) or >(...) (see the note at its top): $(cat "$T/substitutions")"
  pass "mpirun/srun command lines"
}

# --simulate-nodes with GPUs: each simulated node's ranks see only its share of the host's GPUs
# (one rank per GPU of it by default), and each node has its log with its ranks' lines.
case_simulate_nodes() {
  local job; job=$(make_job simnodes)
  CUDA_VISIBLE_DEVICES=4,5,6,7 THETAD_FAKE_STEPS=1 run_launcher "$T/sim" --simulate-nodes 2 --log-dir "$T/sim-logs" "$job"
  ((RC == 0)) || { cat "$T/sim.err" >&2; fail "--simulate-nodes 2 with 4 GPUs: want exit 0, got $RC"; }
  assert_grep 'job simnodes-.*: 4 rank\(s\) on 2 node\(s\)' "$T/sim.err" "want 2 nodes x 2 ranks (one per GPU of a node)"
  local r want
  for r in 0 1 2 3; do
    want=$([[ $r -lt 2 ]] && echo 4,5 || echo 6,7)
    assert_grep "\[rank $r\] \[daemon\] info: CUDA_VISIBLE_DEVICES=$want\$" "$T/sim-logs/rank-$r.log" "rank $r should see GPUs $want"
    assert_grep "\[rank $r\] \[daemon\] info: step 1" "$T/sim-logs/node-$((r / 2)).log" "node-$((r / 2)).log lacks rank $r"
    assert_grep "host [^ ]+ node $((r / 2)) pid" "$T/sim-logs/rank-$r.log" "rank $r's header should name node $((r / 2))"
  done
  assert_no_grep '\[rank [23]\]' "$T/sim-logs/node-0.log" "node-0.log holds ranks of node 1"
  pass "--simulate-nodes 2 with 4 GPUs: nodes see GPUs 4,5 and 6,7; node-0.log and node-1.log"
}

# A storm of SIGTERMs to the launcher while it stops the ranks (Slurm's requeue signals the job's
# processes, and the batch script forwards another): every `wait` of the launcher is interrupted,
# and bash 5.2 breaks a trap that lands while it parses a $(...), so the launcher must run none
# then. Exit 4, every rank checkpointed, no parse error. (The ranks' wrappers get one signal
# each here; rank_signal_storm storms them.)
case_sigterm_storm() {
  local i
  start_checkpointing_ranks storm 2
  for ((i = 0; i < 1500; i++)); do
    kill -TERM "$LPID" 2>/dev/null || break
    sleep 0.002
  done
  wait_exit "$LPID" 30
  ((RC == 4)) || { cat "$T/storm.err" >&2; fail "SIGTERM storm: want launcher exit 4, got $RC"; }
  assert_no_grep 'unexpected EOF|syntax error' "$T/storm.err" "a trap broke the launcher's parser"
  ranks_stopped "$T/logs" 'checkpoint complete'
  no_leftovers
  pass "a storm of SIGTERMs to the launcher while stopping: checkpoints complete, exit 4"
}

# srun ending before its tasks (Slurm's requeue signals it too; the tasks are slurmstepd's):
# THETAD_MPIRUN is a fake that starts the ranks in sessions of their own and exits 143 on the
# launcher's stop while they still checkpoint (3 s). The launcher must wait for them: when it
# exits 4, every rank has exited 4 with its checkpoint complete.
case_stop_outlives_srun() {
  local job r
  job=$(make_job early)
  THETAD_MPIRUN=$LAUNCH_TEST_DIR/fake_srun_like_mpirun.sh THETAD_FAKE_STEPS=600 THETAD_FAKE_SLEEP=0.1 \
    THETAD_FAKE_STOP_SLEEP=3 start_launcher "$T/early" --nproc-per-node 2 --log-dir "$T/logs" "$job"
  wait_for 30 test -e "$THETAD_FAKE_STATE/pid-1"
  sleep 0.5
  kill -TERM "$LPID"
  wait_exit "$LPID" 30
  ((RC == 4)) || { cat "$T/early.err" >&2; fail "ranks outliving mpirun/srun: want launcher exit 4, got $RC"; }
  for r in 0 1; do
    [[ -e $T/logs/rank-$r.exit && $(cut -d' ' -f1 "$T/logs/rank-$r.exit") == 4 ]] ||
      { cat "$T/early.err" >&2; fail "launcher exited 4 before rank $r recorded its exit 4"; }
    assert_grep 'checkpoint complete' "$T/logs/rank-$r.log" "rank $r: checkpoint not complete when the launcher exited"
  done
  assert_grep 'waiting for their stop checkpoints' "$T/early.err" "the launcher did not say it waited"
  no_leftovers
  pass "srun ending before its ranks: the launcher waited ${ELAPSED}s for their checkpoints, exit 4"
}

# An mpirun that catches SIGUSR1 and forwards nothing: the stop must still reach this host's
# ranks (the launcher also signals their wrappers itself). On the GPU image's mpirun the stop
# never reached the ranks and the launcher ran on; this is that symptom.
case_stop_unforwarded() {
  local job
  job=$(make_job unfwd)
  cat >"$T/mpirun-swallows-usr1" <<SHIM
#!/usr/bin/env bash
trap 'echo "mpirun shim: SIGUSR1 swallowed" >&2' USR1
${THETAD_MPIRUN:-mpirun} "\$@" &
pid=\$!
while :; do
  wait "\$pid"; rc=\$?
  kill -0 "\$pid" 2>/dev/null || exit "\$rc"
done
SHIM
  chmod +x "$T/mpirun-swallows-usr1"
  set -m
  THETAD_MPIRUN=$T/mpirun-swallows-usr1 THETAD_FAKE_STEPS=600 THETAD_FAKE_SLEEP=0.1 \
    start_launcher "$T/unfwd" --nproc-per-node 2 --log-dir "$T/logs" "$job"
  set +m
  wait_for 30 test -e "$THETAD_FAKE_STATE/pid-0"
  wait_for 30 test -e "$THETAD_FAKE_STATE/pid-1"
  sleep 0.5
  kill -TERM "$LPID"
  wait_exit "$LPID" 30
  ((RC == 4)) || { cat "$T/unfwd.err" >&2; fail "mpirun forwarding nothing: want launcher exit 4, got $RC"; }
  assert_grep 'SIGUSR1 swallowed' "$T/unfwd.err" "the shim did not get the launcher's SIGUSR1"
  ranks_stopped "$T/logs" 'got SIGTERM'
  no_leftovers
  pass "an mpirun that forwards no SIGUSR1: this host's ranks stopped all the same, exit 4 in ${ELAPSED}s"
}

# Slurm's requeue and srun's forwarding of the launcher's stop signal every process of a task
# (proctrack/linuxproc and cgroup signal the whole step): the rank's wrapper, its helpers and
# thetad get SIGTERM and SIGUSR1, often more than once. Here the wrapper runs as slurmstepd
# starts a task (a session of its own) and its whole session gets a storm of both while the
# rank checkpoints and exits, 10 times: the wrapper must exit with the rank's 4 every time. Seen
# in CI: a helper it ran then, killed by the storm, made it exit 138 under set -e; and a signal
# that interrupted its `wait` just as the rank ended made bash lose the rank's status (exit 255).
case_rank_signal_storm() {
  local job i w rc code end bad=0
  job=$(make_job rstorm)
  for ((i = 0; i < 10; i++)); do
    rm -f "$THETAD_FAKE_STATE/pid-0"
    THETAD_FAKE_STEPS=600 THETAD_FAKE_SLEEP=0.1 THETAD_FAKE_STOP_SLEEP=0.3 OMPI_COMM_WORLD_RANK=0 \
      OMPI_COMM_WORLD_SIZE=1 setsid "$LAUNCHER" --worker "$T/logs" -- "$FAKE" run "$job" 2>>"$T/rstorm.err" &
    w=$!
    wait_for 30 test -e "$THETAD_FAKE_STATE/pid-0"
    sleep 0.3
    end=$((SECONDS + 5))
    while alive "$w" && ((SECONDS < end)); do
      pkill -TERM -s "$w" 2>/dev/null || true
      pkill -USR1 -s "$w" 2>/dev/null || true
      sleep 0.00$((RANDOM % 10))
    done
    rc=0
    wait "$w" || rc=$?
    code=$(cut -d' ' -f1 "$T/logs/rank-0.exit" 2>/dev/null || echo none)
    if ((rc != 4)) || [[ $code != 4 ]]; then
      bad=$((bad + 1))
      echo "storm $i: wrapper exit $rc, exit record $code" >&2
    fi
  done
  ((bad == 0)) || { tail -n 20 "$T/rstorm.err" >&2; fail "$bad of 10 rank wrappers under a signal storm did not exit 4"; }
  no_leftovers
  pass "10 rank wrappers stormed with SIGTERM and SIGUSR1 (whole session) while stopping: each exited 4"
}

case ${1:-} in
  bad_job) case_bad_job ;;
  rank_fails) case_rank_fails ;;
  logs) case_logs ;;
  sigterm) sig_case TERM ;;
  sigint) sig_case INT ;;
  sigint_bg) sig_case INT bg ;;
  early_stop) case_early_stop ;;
  startup_storm) case_startup_storm ;;
  stop_twice) case_stop_twice ;;
  sigterm_storm) case_sigterm_storm ;;
  rank_signal_storm) case_rank_signal_storm ;;
  stop_outlives_srun) case_stop_outlives_srun ;;
  stop_unforwarded) case_stop_unforwarded ;;
  bad_args) case_bad_args ;;
  bad_hostfile) case_bad_hostfile ;;
  checked_bytes) case_checked_bytes ;;
  stop_during_check) case_stop_during_check ;;
  kill9) case_kill9 ;;
  kill9_wrapper) case_kill9_wrapper ;;
  flags) case_flags ;;
  simulate_nodes) case_simulate_nodes ;;
  all) case_flags; case_bad_job; case_bad_args; case_checked_bytes; case_rank_fails; case_logs; sig_case TERM; sig_case INT
       sig_case INT bg; case_early_stop; case_stop_twice; case_sigterm_storm; case_rank_signal_storm; case_kill9; case_kill9_wrapper ;;
  *) echo "usage: $0 bad_job|bad_args|bad_hostfile|checked_bytes|stop_during_check|rank_fails|logs|sigterm|sigint|sigint_bg|early_stop|startup_storm|stop_twice|sigterm_storm|rank_signal_storm|stop_outlives_srun|stop_unforwarded|kill9|kill9_wrapper|flags|all" >&2; exit 2 ;;
esac
