#!/usr/bin/env bash
# Stop the cluster of dev/slurm/start_cluster.sh: cancel its jobs, then stop
# slurmd, slurmctld and munged by the pid files they wrote.
# Usage: bash dev/slurm/stop_cluster.sh
set -uo pipefail

STATE="${MMAE_SLURM_STATE:-/var/lib/mmae-slurm}"
stop() {  # stop NAME PIDFILE: TERM the daemon, wait for it to go
  local name=$1 pidfile=$2 pid
  pid=$(cat "$pidfile" 2>/dev/null)
  [ -n "$pid" ] || return 0
  echo "[slurm] stopping $name ($pid)"
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || return 0; sleep 1; done
  kill -9 "$pid" 2>/dev/null || true
}
scancel --user=root 2>/dev/null || true
stop slurmd "$STATE/slurmd.pid"
stop slurmctld "$STATE/slurmctld.pid"
stop munged /run/munge/munged.pid
