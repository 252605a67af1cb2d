#!/usr/bin/env bash
# What keeps other local users out of a launch, with a FAKE thetad (fake_thetad.sh) under real
# mpirun. Usage: security.sh CASE (see the case list at the end). Cases that need a second user
# run as root (setpriv to uid 65534) and skip (exit 77) otherwise.
set -euo pipefail
# shellcheck source=tests/launch/fake_run.sh
source "$(dirname "$0")/fake_run.sh"
OTHER=65534  # nobody: the other local user

as_other() {  # as_other CMD...: CMD as uid 65534, no groups, no capabilities
  setpriv --reuid="$OTHER" --regid="$OTHER" --clear-groups --inh-caps=-all -- "$@"
}

have_other_user() { [[ $(id -u) == 0 ]] && command -v setpriv >/dev/null && as_other true 2>/dev/null; }

need_other_user() {
  have_other_user || skip "needs root and setpriv to act as uid $OTHER"
  chmod 755 "$T"  # the other user may reach what the test shares with it
}

# A shared directory (sticky and open to all, like /tmp) where another user prepared the run's
# log dir with links to the launching user's files: the launcher refuses it (exit 2, nothing
# started) and writes nothing through the links. It used to append its log to the link's
# target (a shell rc file got the ranks' lines).
case_shared_dir() {
  need_other_user
  local job dir; job=$(make_job shared)
  mkdir -m 1777 "$T/shared"
  chmod 1777 "$T/shared"
  printf 'export PATH=/usr/bin\n' >"$T/bashrc"
  printf 'secret\n' >"$T/secret" && chmod 600 "$T/secret"
  dir=$T/shared/runs/shared-$MARKER/logs
  as_other mkdir -p "$dir"
  as_other chmod 0777 "$T/shared/runs" "$T/shared/runs/shared-$MARKER" "$dir"
  as_other ln -s "$T/bashrc" "$dir/launcher.log"
  as_other ln -s "$T/secret" "$dir/rank-0.log"
  mpirun_shim
  (cd "$T/shared" && THETAD_MPIRUN=$T/mpirun-shim run_launcher "$T/shared" --nproc-per-node 1 "$job"; echo "$RC" >"$T/rc")
  RC=$(cat "$T/rc")
  ((RC == 2)) || { cat "$T/shared.err" >&2; fail "a log dir another user prepared: want exit 2, got $RC"; }
  assert_grep "log dir 'runs/shared-$MARKER/logs': '$T/shared/runs' " "$T/shared.err"
  [[ $(cat "$T/bashrc") == 'export PATH=/usr/bin' ]] || fail "the launcher wrote through a link into another file: $(cat "$T/bashrc")"
  [[ $(cat "$T/secret") == secret ]] || fail "a rank's log was written through a link"
  [[ ! -e $T/mpirun-started ]] || fail "mpirun was started"
  # The same run from a directory of its own: the dirs are created 0700.
  mkdir "$T/own"
  (cd "$T/own" && THETAD_FAKE_STEPS=1 run_launcher "$T/own" --nproc-per-node 1 "$job"; echo "$RC" >"$T/rc")
  RC=$(cat "$T/rc")
  ((RC == 0)) || { cat "$T/own.err" >&2; fail "a run in its own dir: want exit 0, got $RC"; }
  for dir in runs runs/shared-$MARKER runs/shared-$MARKER/logs; do
    [[ $(stat -c %a "$T/own/$dir") == 700 ]] || fail "$dir: mode $(stat -c %a "$T/own/$dir"), want 700"
  done
  [[ $(stat -c %a "$T/own/runs/shared-$MARKER/logs/rank-0.log") == 600 ]] || fail "rank-0.log is not 0600"
  no_leftovers
  pass "a log dir prepared by another user in a shared dir: exit 2, nothing written through its links; own dirs 0700"
}

# Links planted in the run's own log dir (as a dir that others could write once would have
# them): the records' temporary files have random names created with O_EXCL (a link at the old
# predictable name rank-0.pid.tmp had the pid record truncate a 0600 file), and a rank log that
# is a link is exit 2 before anything starts (it had the rank's lines appended to its target).
case_planted_links() {
  local job; job=$(make_job planted)
  mkdir -m 700 "$T/logs"
  printf 'secret\n' >"$T/secret" && chmod 600 "$T/secret"
  ln -s "$T/secret" "$T/logs/rank-0.pid.tmp"
  ln -s "$T/secret" "$T/logs/rank-0.exit.tmp"
  THETAD_FAKE_STEPS=1 run_launcher "$T/planted" --nproc-per-node 1 --log-dir "$T/logs" "$job"
  ((RC == 0)) || { cat "$T/planted.err" >&2; fail "want exit 0, got $RC"; }
  [[ $(cat "$T/secret") == secret ]] || fail "a record was written through a planted link: $(cat "$T/secret")"
  [[ -L $T/logs/rank-0.pid.tmp ]] || fail "the planted link was replaced"
  [[ $(cut -d' ' -f1 "$T/logs/rank-0.exit") == 0 ]] || fail "no exit record"
  ln -s "$T/secret" "$T/logs/rank-1.log"
  mpirun_shim
  THETAD_MPIRUN=$T/mpirun-shim run_launcher "$T/planted2" --nproc-per-node 2 --log-dir "$T/logs" "$job"
  ((RC == 2)) || { cat "$T/planted2.err" >&2; fail "a rank log that is a link: want exit 2, got $RC"; }
  assert_grep "log file '$T/logs/rank-1.log' is a symbolic link: not written" "$T/planted2.err"
  [[ $(cat "$T/secret") == secret ]] || fail "a rank's lines were written through a planted link"
  [[ ! -e $T/mpirun-started ]] || fail "mpirun was started"
  no_leftovers
  pass "links planted in the log dir: never written through; a rank log that is a link is exit 2 before the start"
}

# connect_as WHO SOCKET FIRST_LINE: connects to the launcher's log socket as `me` or `other`,
# sends FIRST_LINE, forged rank lines with terminal escapes and 1 MB without a newline; prints
# "refused ..." and exits 3 when it cannot connect. SOCKET: a path, or an abstract name.
connect_as() {
  local who=$1; shift
  cat >"$T/client.py" <<'PY'
import socket, sys, time
name, first = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(name if name.startswith("/") else "\0" + name)
except OSError as e:
    print("refused:", e.strerror)
    sys.exit(3)
try:
    s.sendall(first.encode() + b"\n")
    s.sendall(b"[rank 0] [comm] error: forged by a stranger\x1b]0;pwned\x07\n" * 50)
    s.sendall(b"y" * 1000000)
except OSError:
    pass
time.sleep(0.5)
print("connected")
PY
  if [[ $who == other ]]; then as_other /usr/bin/python3 "$T/client.py" "$@"; else /usr/bin/python3 "$T/client.py" "$@"; fi
}

# The ranks' log socket: a file in a private directory, not a name in /proc/net/unix; another
# user cannot connect to it, and a connection of this user's without the launch's token adds
# no line to the merged log and counts as no rank. Before, anyone could connect, forge
# "[rank 1] ... error" lines and terminal escapes, and count as a rank.
case_log_socket() {
  local job wrapper sock out r thetad_pid; job=$(make_job sock)
  [[ -x /usr/bin/python3 ]] || skip "needs /usr/bin/python3"
  set -m
  THETAD_FAKE_STEPS=600 THETAD_FAKE_SLEEP=0.1 start_launcher "$T/sock" --nproc-per-node 2 --log-dir "$T/logs" "$job"
  set +m
  wait_for 30 test -e "$THETAD_FAKE_STATE/pid-1"
  wait_for 30 test -e "$T/logs/rank-1.pid"
  read -r wrapper _ <"$T/logs/rank-1.pid"
  sock=$(tr '\0' '\n' <"/proc/$wrapper/environ" | sed -n 's/^THETAD_LAUNCH_LOG_SOCKET=//p')
  [[ -n $sock ]] || fail "no log socket named in the wrapper's environment"
  [[ $sock == /* ]] || fail "the log socket is an abstract name ($sock), open to every local user"
  ! grep -q '@thetad-launch' /proc/net/unix || fail "an abstract thetad-launch socket in /proc/net/unix"
  [[ $(stat -c '%a %u' "$(dirname "$sock")") == "700 $(id -u)" ]] || fail "the socket's directory is not 0700 and ours"
  thetad_pid=$(cat "$THETAD_FAKE_STATE/pid-1")
  ! tr '\0' '\n' <"/proc/$thetad_pid/environ" | grep -q '^THETAD_LAUNCH_LOG_' || fail "thetad's environment holds the log socket's path or token"
  if have_other_user; then
    chmod 755 "$T"
    out=$(connect_as other "$sock" 1) || true
    [[ $out == refused* ]] || fail "another user connected to the log socket: $out"
    echo "another user: $out"
  fi
  out=$(connect_as me "$sock" 1) || true
  echo "this user, no token: $out"
  wait_for 10 grep -q 'refused a log connection' "$T/sock.err"
  kill -TERM "$LPID"
  wait_exit "$LPID" 30
  ((RC == 4)) || { cat "$T/sock.err" >&2; fail "stop: want exit 4, got $RC"; }
  assert_no_grep 'forged by a stranger|pwned' "$T/sock.err" "a stranger's line reached the merged stream"
  assert_no_grep 'forged by a stranger|pwned' "$T/logs/launcher.log" "a stranger's line reached launcher.log"
  assert_grep "refused a log connection from pid [0-9]+: without the launch's token" "$T/sock.err"
  for r in 0 1; do assert_grep "^\[rank $r\] untagged line from fake rank $r\$" "$T/sock.err"; done
  [[ ! -e $sock && ! -e $(dirname "$sock") ]] || fail "the socket's directory outlived the launcher"
  no_leftovers
  pass "log socket: a private file, closed to other users; no token, no line and no rank"
}

# A rank's lines in the merged stream: one quoting another rank's tag still reads as its own,
# and control bytes (terminal escapes, carriage returns) are written out, not sent to the
# terminal. Before, "[rank 0] ..." written by rank 1 read as rank 0's, escapes went raw.
case_forged_lines() {
  local job; job=$(make_job forged)
  THETAD_FAKE_STEPS=1 THETAD_FAKE_RAW='[rank 0] [comm] error: forged by rank 1\n\e]0;pwned\a\e[2Jcleared\rthetad-launch: all done\n' \
    run_launcher "$T/forged" --nproc-per-node 2 --log-dir "$T/logs" "$job"
  ((RC == 0)) || { cat "$T/forged.err" >&2; fail "want exit 0, got $RC"; }
  local f
  for f in "$T/forged.err" "$T/logs/launcher.log"; do
    assert_grep '^\[rank 1\] \[rank 0\] \[comm\] error: forged by rank 1$' "$f" "a line of rank 1 quoting rank 0's tag"
    assert_no_grep '^\[rank 0\] \[comm\] error: forged' "$f" "rank 1's line reads as rank 0's"
    assert_grep '^\[rank 1\] \\x1b\]0;pwned\\x07\\x1b\[2Jcleared\\x0dthetad-launch: all done$' "$f" "escapes not written out"
    ! grep -q $'\e' "$f" || fail "an escape byte reached $f"
  done
  assert_grep '^\[rank 1\] \[rank 0\] \[comm\] error: forged by rank 1$' "$T/logs/node-$(hostname).log" "node log"
  grep -q $'\e]0;pwned' "$T/logs/rank-1.log" || fail "rank-1.log should keep the rank's bytes as written"
  no_leftovers
  pass "a rank's line quoting another rank's tag keeps its own; control bytes written out in merged logs"
}

# A rank writing without a newline: its wrapper flushes 64 KiB pieces, each tagged and marked as
# partial, and stays small (100 MB without a newline grew it by as much before).
case_endless_line() {
  local rss lines
  OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1 command time -f '%M' -o "$T/rss" \
    "$LAUNCHER" --worker "$T/logs" -- bash -c "head -c 100000000 /dev/zero | tr '\\0' x >&2; echo ' end' >&2" \
    2>"$T/merged" || fail "the wrapper failed"
  rss=$(tail -n 1 "$T/rss")
  echo "wrapper's peak resident memory: $rss KiB"
  ((rss < 40000)) || fail "the wrapper grew to $rss KiB for a line without a newline"
  lines=$(awk 'BEGIN { mark = " [partial line: continues on the next line]" }
               /^\[rank 0\] x+ \[partial line: continues on the next line\]$/ && length($0) == 9 + 65536 + length(mark) { n++ }
               END { print n + 0 }' "$T/merged")
  ((lines == 100000000 / 65536)) || fail "want $((100000000 / 65536)) marked pieces of 64 KiB, got $lines"
  assert_grep '^\[rank 0\] x+ end$' "$T/merged" "the line's end"
  awk 'length($0) > 65536 + 64 { exit 1 }' "$T/merged" || fail "a merged line longer than a piece"
  pass "100 MB without a newline: 64 KiB pieces, each tagged and marked; the wrapper stayed at $rss KiB"
}

case ${1:-} in
  shared_dir) case_shared_dir ;;
  planted_links) case_planted_links ;;
  log_socket) case_log_socket ;;
  forged_lines) case_forged_lines ;;
  endless_line) case_endless_line ;;
  *) echo "usage: $0 shared_dir|planted_links|log_socket|forged_lines|endless_line" >&2; exit 2 ;;
esac
