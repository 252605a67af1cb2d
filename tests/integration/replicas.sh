#!/usr/bin/env bash
# The replica rule (docs/architecture.md, "Who holds a group's current values") on CPU ranks:
#  - heads that stay with their users (round_robin, T a multiple of W; 2 and 4 ranks): only Θ is
#    reduced, exactly its bytes at every step, the heads' bytes kept; equal to the single-process
#    reference, and bitwise to comm.sole_user: broadcast (every gradient sent, every rank stepping);
#  - bf16 on the wire: a kept gradient is not rounded, and the reference mirrors it (a reference
#    that rounded it, as with sole_user: broadcast, differs);
#  - users that change (weighted, 2 ranks): state moves between ranks, point-to-point and by
#    broadcast, and the result is bitwise that of sending every gradient and the reference's;
#  - a checkpoint in the middle of stale replicas makes every replica current (its moves counted
#    in the next step), and resuming from it is bitwise the straight run.
source "$(dirname "$0")/lib.sh"
thetad=$1
reference=$2
job=$HERE/jobs/equiv.yaml
# equiv.yaml: Θ = (12x16 + 16) + (16x16 + 16) = 480 parameters, θ[t] = (16x16 + 16) + (16x1 + 1) = 289.
theta=480 head=289

# per_step FILE EXPR...: every record of the metrics FILE satisfies each python EXPR over its
# fields (r); prints the first that does not.
per_step() {
  local file=$1; shift
  /usr/bin/python3 - "$file" "$@" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert recs, "no records"
for expr in sys.argv[2:]:
    for r in recs:
        assert eval(expr, {}, {"r": r}), f"step {r['step']}: {expr} fails: " + json.dumps(
            {k: r[k] for k in ("bytes_allreduced", "bytes_kept", "buckets_kept", "bytes_state_moved", "state_moves")})
PY
}

# Heads stay with their users: T = 4 on 2 ranks, T = 8 on 4.
rr=(--set data.schedule=round_robin)
run_np keep_np2 2 "$job" "${rr[@]}" --set model.tasks=4
run_np broadcast_np2 2 "$job" "${rr[@]}" --set model.tasks=4 --set comm.sole_user=broadcast
per_step "$WORK/keep_np2.jsonl" "r['bytes_allreduced'] == 4 * $theta" "r['bytes_kept'] == 2 * 4 * $head" \
  "r['bytes_state_moved'] == 0" \
  && pass "2 ranks: bytes_allreduced = Θ's exactly (4 x $theta), both heads' bytes kept, no state moved" \
  || fail "2 ranks: bytes per step"
per_step "$WORK/broadcast_np2.jsonl" "r['bytes_allreduced'] == 4 * ($theta + 2 * $head)" "r['bytes_kept'] == 0" \
  && pass "sole_user: broadcast sends every head's gradient" || fail "sole_user: broadcast bytes"
same_hash "kept heads == every gradient sent, bitwise" keep_np2 broadcast_np2
expect_code 0 keep_np2-reference "$reference" "$job" --world 2 "${rr[@]}" --set model.tasks=4 \
  --compare "$WORK/keep_np2.ckpt" --tol 0
expect_in keep_np2 "resident groups follow the replica rule"

run_np keep_np4 4 "$job" "${rr[@]}" --set model.tasks=8 --set steps=12
per_step "$WORK/keep_np4.jsonl" "r['bytes_allreduced'] == 4 * $theta" "r['bytes_kept'] == 4 * 4 * $head" \
  && pass "4 ranks: bytes_allreduced = Θ's exactly, four heads kept" || fail "4 ranks: bytes per step"
expect_code 0 keep_np4-reference "$reference" "$job" --world 4 "${rr[@]}" --set model.tasks=8 --set steps=12 \
  --compare "$WORK/keep_np4.ckpt"

# bf16 on the wire: Θ's gradient is rounded, the kept heads' are not; the reference follows the
# same rule, and one that rounded the heads (sole_user: broadcast) does not match.
bf=("${rr[@]}" --set model.tasks=4 --set comm.grad_dtype=bf16)
run_np keep_bf16 2 "$job" "${bf[@]}"
expect_code 0 keep_bf16-reference "$reference" "$job" --world 2 "${bf[@]}" --compare "$WORK/keep_bf16.ckpt" --tol 0
expect_code 1 keep_bf16-rounding-reference "$reference" "$job" --world 2 "${bf[@]}" --set comm.sole_user=broadcast \
  --compare "$WORK/keep_bf16.ckpt" --tol 0

# Users that change: weighted draws on 2 ranks (4 tasks, seed 3) give runs of one user long enough
# to keep, then the next user's (a point-to-point move of the state) or a window that sends the
# gradient (a broadcast first). Each rank's timeline names its moves.
wt=(--set data.schedule=weighted --set data.weights=[1,1,1,1] --set model.tasks=4 --set seed=3 --set steps=200)
run_np moves_keep 2 "$job" "${wt[@]}" --set timeline.path="$WORK/moves_keep-{rank}.trace.json"
run_np moves_broadcast 2 "$job" "${wt[@]}" --set comm.sole_user=broadcast
/usr/bin/python3 - "$WORK/moves_keep.jsonl" "$head" "$WORK"/moves_keep-*.trace.json <<'PY' \
  && pass "users change: gradients kept, state moved point-to-point and by broadcast" || fail "users change"
import json, re, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
head = int(sys.argv[2])
kept = sum(r["buckets_kept"] for r in recs)
moves = sum(r["state_moves"] for r in recs)
moved = sum(r["bytes_state_moved"] for r in recs)
names = [e.get("name", "") for p in sys.argv[3:] for e in json.load(open(p))["traceEvents"]]
p2p = sum(bool(re.match(r"state of group \d+ from rank \d+ to rank \d+$", n)) for n in names)
bcast = sum(n.endswith("to every rank") for n in names)
print(f"{kept} buckets kept, {moves} moves of {moved} bytes; timeline: {p2p} point-to-point, {bcast} broadcast records")
assert kept > 0 and p2p > 0 and bcast > 0, "the schedule no longer keeps or moves both ways: the test tests less"
assert moved == moves * 12 * head, "each move carries one head's values and two moments"
for r in recs:
    assert r["bytes_allreduced"] + r["bytes_pruned"] + r["bytes_kept"] == 4 * (480 + 4 * head), r
PY
same_hash "users change: moved state == every gradient sent, bitwise" moves_keep moves_broadcast
expect_code 0 moves_keep-reference "$reference" "$job" --world 2 "${wt[@]}" --compare "$WORK/moves_keep.ckpt" --tol 0

# A checkpoint amid stale replicas: every head is held by its user alone at step 10; the
# checkpoint broadcasts all four (4 moves of 12 bytes x 289 elements, counted with step 10), and a run
# resumed from it ends bitwise as the straight run.
run_np straight 2 "$job" "${rr[@]}" --set model.tasks=4 --set checkpoint.every_steps=10
per_step "$WORK/straight.jsonl" "r['state_moves'] == (4 if r['step'] == 10 else 0)" \
  "r['bytes_state_moved'] == (4 * 12 * $head if r['step'] == 10 else 0)" \
  && pass "the checkpoint at step 10 made the four stale heads current (4 broadcasts)" || fail "checkpoint moves"
same_hash "checkpoints change nothing" straight keep_np2
resume=(mpirun "${MPIRUN_FLAGS[@]}" -np 2 "$thetad" run "$job" "${rr[@]}" --set model.tasks=4
        --set checkpoint.every_steps=10 --set checkpoint.dir="$WORK/resume.ckpt" --set log.level=info)
expect_code 0 resume_first "${resume[@]}" --set steps=10 --no-resume
expect_code 0 resume_second "${resume[@]}"
expect_in resume_second "resumed from .*step-00000010"
same_hash "resumed at step 10 amid stale replicas == straight, bitwise" resume_second straight
finish
