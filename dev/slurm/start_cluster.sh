#!/usr/bin/env bash
# Start a single-node Slurm cluster on this machine, for testing the
# comparison tool's Slurm path against a real scheduler (no mock):
# munged, slurmctld and slurmd on localhost, one node with 2 CPUs, one
# partition `debug`. Installs Debian's slurm-wlm and munge first if they are
# missing (apt-get update once, as root). Idempotent: a running cluster is
# left as it is. No accounting database (sacct reports nothing; the
# comparison tool reads its jobs' state from squeue). Stop with
# dev/slurm/stop_cluster.sh.
# Usage: bash dev/slurm/start_cluster.sh   (root)
set -euo pipefail

STATE="${MMAE_SLURM_STATE:-/var/lib/mmae-slurm}"
CONF=/etc/slurm/slurm.conf
MARK='# written by mmae-plugin dev/slurm/start_cluster.sh'
log() { echo "[slurm] $*"; }

if [ "$(id -u)" != 0 ]; then
  echo "[slurm] needs root (installs packages, starts daemons)" >&2
  exit 2
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || { echo "[slurm] no apt-get" >&2; exit 2; }
  log "installing slurm-wlm and munge"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge \
    >/dev/null
fi

# munge: the key the Debian package made (or a new one), daemon as `munge`.
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! pgrep -u munge -x munged >/dev/null; then
  log "starting munged"
  runuser -u munge -- /usr/sbin/munged
fi

if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
  echo "[slurm] $CONF exists and is not ours: not touching it" >&2
  exit 2
fi
mkdir -p "$STATE/ctld" "$STATE/d" "$STATE/log" /etc/slurm
memory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
# Containers have no usable cgroups: processes are tracked by parent
# (linuxproc), tasks are not bound (task/none). cons_tres with CR_CPU lets
# two 1-CPU jobs share the node. Requeued jobs keep their id and rerun;
# a requeued job's processes get SIGKILL 2 s after SIGTERM (submitit lets a
# job run on through SIGTERM), so a requeue stops training at once, and the
# job may start again 10 s later (cred_expire; Slurm's default is 120 s).
cat > "$CONF" <<CONF
$MARK
ClusterName=mmae
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=2
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF

if ! pgrep -x slurmctld >/dev/null; then
  log "starting slurmctld"
  /usr/sbin/slurmctld -c  # -c: a fresh cluster, no saved jobs
fi
if ! pgrep -x slurmd >/dev/null; then
  log "starting slurmd"
  /usr/sbin/slurmd -N localhost
fi
for _ in $(seq 60); do
  if sinfo -h -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
    log "cluster up: $(sinfo -h -o '%P %D node(s) %c CPUs %t')"
    exit 0
  fi
  sleep 1
done
echo "[slurm] the node did not come up; see $STATE/log/" >&2
sinfo >&2 || true
exit 1
