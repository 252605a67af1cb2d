#!/usr/bin/env bash
# A FAKE mpirun (THETAD_MPIRUN) that behaves as srun does under Slurm's requeue: it starts the
# ranks' commands outside its own process group (each in a session of its own, as slurmstepd
# starts a step's tasks), and on SIGUSR1 (the launcher's stop) forwards it to the ranks and ends
# at once with exit 143, as srun signalled by Slurm may, while the ranks still checkpoint.
#   fake_srun_like_mpirun.sh -np N [mpirun flags...] LAUNCHER --worker ... -- THETAD run ...
set -uo pipefail
np=1 args=("$@") cmd=()
for ((i = 0; i < ${#args[@]}; i++)); do
  [[ ${args[i]} == -np ]] && np=${args[i + 1]}
  if [[ ${args[i + 1]:-} == --worker ]]; then cmd=("${args[@]:i}"); break; fi
done
((${#cmd[@]})) || { echo "fake mpirun: no --worker command in: $*" >&2; exit 1; }
pids=()
for ((r = 0; r < np; r++)); do
  OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_SIZE=$np setsid "${cmd[@]}" &
  pids+=($!)
done
stop() {
  local p
  for p in "${pids[@]}"; do pkill -USR1 -s "$p" 2>/dev/null || kill -USR1 "$p" 2>/dev/null; done
  exit 143
}
trap stop USR1
while :; do
  wait -n 2>/dev/null
  rc=$?
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  ((alive)) || exit "$rc"
done
