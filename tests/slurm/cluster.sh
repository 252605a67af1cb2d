# A one-node Slurm cluster on this machine for tests (sourced): Debian's slurmctld, slurmd and
# munge, every file in the caller's temporary directory (its own slurm.conf, ports, state, munge
# key and socket), ended by slurm_stop (the caller's EXIT trap). Nothing under /etc is used:
# SLURM_CONF points the clients at our slurm.conf.
#
#   source tests/slurm/cluster.sh
#   slurm_install || skip "..."       # apt-get install when a piece is missing
#   slurm_start "$dir" || skip "..."  # sets SLURM_CONF; sinfo, sbatch, srun ... work
#   trap slurm_stop EXIT
# shellcheck shell=bash disable=SC2034  # SLURM_WHY is read by the scripts that source this

SLURM_PKGS=(slurmctld slurmd munge slurm-client)
SLURM_DIR="" SLURM_WHY=""

# Installs the packages when a command is missing; SLURM_WHY says why not.
slurm_install() {
  local c missing=0
  for c in slurmctld slurmd munged sbatch srun scontrol; do
    command -v "$c" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$c" >/dev/null 2>&1 || missing=1
  done
  export PATH=$PATH:/usr/sbin
  ((missing)) || return 0
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    SLURM_WHY="Slurm is not installed and this is no root Debian machine to apt-get it on"
    return 1
  fi
  echo "installing ${SLURM_PKGS[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq "${SLURM_PKGS[@]}" >"${TMPDIR:-/tmp}/thetad-slurm-apt.log" 2>&1; then
    # A machine whose package lists are old or absent: refresh them once.
    if ! { apt-get update -qq && apt-get install -y -qq "${SLURM_PKGS[@]}"; } >>"${TMPDIR:-/tmp}/thetad-slurm-apt.log" 2>&1; then
      SLURM_WHY="apt-get install ${SLURM_PKGS[*]} failed: $(tail -n 2 "${TMPDIR:-/tmp}/thetad-slurm-apt.log" | tr '\n' ' ')"
      return 1
    fi
  fi
}

# A TCP port nobody listens on, from a range that Slurm's defaults (6817-6819) stay clear of.
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 20000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  return 1
}

# slurm_start DIR: munged, slurmctld and slurmd with everything under DIR; waits until the node
# is idle (60 s at most). Sets SLURM_CONF for the clients; SLURM_WHY says why it failed.
slurm_start() {
  SLURM_DIR=$1
  local d=$SLURM_DIR host cpus mem ctld_port d_port
  mkdir -p "$d/munge" "$d/state" "$d/spool" "$d/log"
  chmod 700 "$d/munge"
  host=$(hostname -s)
  read -r cpus mem < <(slurmd -C 2>/dev/null | sed -n -E 's/.*CPUs=([0-9]+).*RealMemory=([0-9]+).*/\1 \2/p')
  [[ -n $cpus ]] || { SLURM_WHY="slurmd -C does not describe this machine"; return 1; }
  if ! ctld_port=$(free_port) || ! d_port=$(free_port); then SLURM_WHY="no free TCP port"; return 1; fi

  dd if=/dev/urandom of="$d/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$d/munge/munge.key"
  munged --force --key-file="$d/munge/munge.key" --socket="$d/munge/munge.sock" \
    --pid-file="$d/munge/munged.pid" --log-file="$d/log/munged.log" --seed-file="$d/munge/seed" \
    >"$d/log/munged.out" 2>&1 || { SLURM_WHY="munged did not start: $(tail -n 3 "$d/log/munged.out" "$d/log/munged.log" 2>/dev/null | tr '\n' ' ')"; return 1; }

  cat >"$d/slurm.conf" <<CONF
ClusterName=thetadtest
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$d/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: process tracking by /proc, no task binding (works in containers).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
MinJobAge=600
KillWait=30
PlugStackConfig=$d/plugstack.conf
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  : >"$d/plugstack.conf"
  export SLURM_CONF=$d/slurm.conf
  slurmctld -i -f "$d/slurm.conf" >"$d/log/slurmctld.out" 2>&1 ||
    { SLURM_WHY="slurmctld did not start: $(tail -n 3 "$d/log/slurmctld.out" "$d/log/slurmctld.log" 2>/dev/null | tr '\n' ' ')"; return 1; }
  slurmd -f "$d/slurm.conf" >"$d/log/slurmd.out" 2>&1 ||
    { SLURM_WHY="slurmd did not start: $(tail -n 3 "$d/log/slurmd.out" "$d/log/slurmd.log" 2>/dev/null | tr '\n' ' ')"; return 1; }
  local deadline=$((SECONDS + 60)) state
  while ((SECONDS < deadline)); do
    state=$(sinfo -h -N -o '%T' 2>/dev/null | head -n 1)
    [[ $state == idle* || $state == mixed* ]] && return 0
    sleep 0.5
  done
  SLURM_WHY="the node did not become idle in 60 s (state '${state:-?}'): $(tail -n 3 "$d/log/slurmd.log" "$d/log/slurmctld.log" 2>/dev/null | tr '\n' ' ')"
  return 1
}

# Ends what slurm_start started (by the pid files in SLURM_DIR), jobs first.
slurm_stop() {
  [[ -n $SLURM_DIR ]] || return 0
  local d=$SLURM_DIR f pid
  scancel --full "--user=$(id -un)" >/dev/null 2>&1 || true
  for f in "$d/slurmd.pid" "$d/slurmctld.pid" "$d/munge/munged.pid"; do
    [[ -s $f ]] || continue
    read -r pid <"$f" || continue
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  SLURM_DIR=""
}
