#!/usr/bin/env bash
# Start or stop a single-node SLURM (slurmctld + slurmd + munge) on localhost, for the cluster test.
# Usage: scripts/slurm-local.sh start STATE_DIR | stop STATE_DIR
# Needs root and Debian's slurm-wlm, slurmctld, slurmd, munge (installed by .ci/run).
set -euo pipefail
action=$1
state=$(realpath -m "$2")

start() {
  mkdir -p "$state"/{state,spool,log} /run/munge /etc/slurm
  chown munge:munge /run/munge
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 2048 ))
  cat > "$state/slurm.conf" <<CONF
ClusterName=genie
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
StateSaveLocation=$state/state
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=300
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
  # The jobstep plugin strips SLURM_CONF from the environment, so the config must sit at the default path.
  ln -sfn "$state/slurm.conf" /etc/slurm/slurm.conf
  runuser -u munge -- /usr/sbin/munged --force   # writes /run/munge/munged.pid (munge cannot write to $state)
  /usr/sbin/slurmctld -D -f /etc/slurm/slurm.conf > "$state/log/slurmctld.out" 2>&1 & echo $! > "$state/slurmctld.bgpid"
  /usr/sbin/slurmd -D -N localhost -f /etc/slurm/slurm.conf > "$state/log/slurmd.out" 2>&1 & echo $! > "$state/slurmd.bgpid"
  for _ in $(seq 1 120); do
    sinfo -h -o %T 2>/dev/null | grep -q '^idle' && { echo "slurm: idle"; return 0; }
    sleep 0.5
  done
  echo "slurm: did not reach idle in 60 s; logs in $state/log" >&2
  return 1
}

stop() {
  for pidfile in "$state/slurmd.bgpid" "$state/slurmctld.bgpid" /run/munge/munged.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
  [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$state/slurm.conf" ] && rm -f /etc/slurm/slurm.conf
  echo "slurm: stopped"
}

"$action"
