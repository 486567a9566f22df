#!/usr/bin/env bash
# Times .ci/slurm/start.sh from a machine without the cluster's packages (purged) and with them installed
# but stopped, three rounds each, interleaved; one JSON line per run.
set -u
cd /work/main
out=/work/startsh/runs.jsonl; : > "$out"
pkgs="slurm-wlm slurmdbd munge mariadb-server slurmctld slurmd slurm-client mariadb-server-core mariadb-client munge libmunge2"
for r in 1 2 3; do
  for mode in fresh installed; do
    bash .ci/slurm/stop.sh >/dev/null 2>&1; sleep 2
    if [ $mode = fresh ]; then
      DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq slurm-wlm slurmdbd slurmctld slurmd slurm-client munge mariadb-server mariadb-server-core >/dev/null 2>&1
      DEBIAN_FRONTEND=noninteractive apt-get autoremove -y -qq >/dev/null 2>&1
      rm -rf /var/lib/moe-lab-slurm /var/lib/mysql /etc/munge
    fi
    load0=$(cut -d' ' -f1-3 /proc/loadavg)
    t0=$(date +%s.%N); bash .ci/slurm/start.sh > /work/startsh/${mode}_$r.log 2>&1; rc=$?; t1=$(date +%s.%N)
    load1=$(cut -d' ' -f1-3 /proc/loadavg)
    printf '{"round": %d, "mode": "%s", "rc": %d, "wall_s": %.2f, "loadavg_before": "%s", "loadavg_after": "%s", "said": "%s"}\n' \
      $r $mode $rc $(echo "$t1 - $t0" | bc) "$load0" "$load1" "$(tail -1 /work/startsh/${mode}_$r.log | tr -d '"')" >> "$out"
  done
done
