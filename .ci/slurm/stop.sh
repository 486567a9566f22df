#!/usr/bin/env bash
# Stop what .ci/slurm/start.sh started: cancel every job, then slurmd, slurmctld, slurmdbd, MariaDB, munge
# (each by its pid file or its own shutdown command). Safe to run when nothing is running.
STATE=/var/lib/moe-lab-slurm
export PATH="$PATH:/usr/sbin"
command -v scancel >/dev/null && scancel --user="$(id -un)" 2>/dev/null
for d in slurmd slurmctld slurmdbd; do
  pidfile="$STATE/$d.pid"
  if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    pid=$(cat "$pidfile"); kill "$pid"
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  fi
done
command -v mysqladmin >/dev/null && mysqladmin shutdown 2>/dev/null
if [ -s /run/munge/munged.pid ]; then kill "$(cat /run/munge/munged.pid)" 2>/dev/null; fi
echo "[slurm] stopped"
