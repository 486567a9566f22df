#!/usr/bin/env bash
# Start a one-node SLURM on localhost (slurmctld + slurmd + munge + slurmdbd on MariaDB, no cgroups)
# for tests/cluster/test_real_slurm*.py. Idempotent: a cluster already up is left as it is (about 1 s).
# Needs root and apt-get (Debian/Ubuntu); otherwise it says why and exits 3, and the real-SLURM tests
# skip saying the same. Stop everything it started with .ci/slurm/stop.sh.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
STATE=/var/lib/moe-lab-slurm
t0=$(date +%s)
say() { echo "[slurm] $*"; }
cannot() { say "cannot start SLURM here: $*"; exit 3; }

if command -v scontrol >/dev/null && scontrol ping 2>/dev/null | grep -q UP && sacct -n -X -S now >/dev/null 2>&1 \
   && sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
  say "already up ($(sinfo -h -o '%P %D node(s) %c CPUs %m MB' | head -1))"; exit 0
fi
[ "$(id -u)" = 0 ] || cannot "not root (the daemons run as root)"
need=(sbatch slurmctld slurmd slurmdbd munged mariadbd)
missing=0; for b in "${need[@]}"; do PATH="$PATH:/usr/sbin" command -v "$b" >/dev/null || missing=1; done
if [ "$missing" = 1 ]; then
  command -v apt-get >/dev/null || cannot "no apt-get to install slurm-wlm, slurmdbd, munge, mariadb-server"
  say "installing slurm-wlm slurmdbd munge mariadb-server (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      slurm-wlm slurmdbd munge mariadb-server >/tmp/moe-lab-slurm-apt.log 2>&1; } \
    || cannot "apt-get install failed (see /tmp/moe-lab-slurm-apt.log)"
fi
export PATH="$PATH:/usr/sbin"

mkdir -p "$STATE"/ctld "$STATE"/d /etc/slurm /run/munge
cpus=$(nproc)
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))  # leave 1 GB to the system
sed -e "s#@STATE@#$STATE#g" -e "s#@CPUS@#$cpus#" -e "s#@MEM_MB@#$mem_mb#" "$HERE/slurm.conf.in" > /etc/slurm/slurm.conf
sed -e "s#@STATE@#$STATE#g" "$HERE/slurmdbd.conf.in" > /etc/slurm/slurmdbd.conf
chmod 600 /etc/slurm/slurmdbd.conf

# munge (authentication between the daemons and the commands)
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then  # a live munged, not a leftover zombie
  [ -s /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  chmod 400 /etc/munge/munge.key
  runuser -u munge -- munged
fi

# MariaDB (slurmdbd's store; sacct reads it through slurmdbd)
if ! mysqladmin ping >/dev/null 2>&1; then
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  (mysqld_safe --skip-networking=0 --bind-address=127.0.0.1 >/dev/null 2>&1 &)
  for _ in $(seq 60); do mysqladmin ping >/dev/null 2>&1 && break; sleep 0.5; done
  mysqladmin ping >/dev/null 2>&1 || cannot "MariaDB did not start"
fi
mysql -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'moelab';
          GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"

start_daemon() {  # name, pid file, readiness command
  local name=$1 pidfile=$2; shift 2
  if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then return; fi
  "$name"
  for _ in $(seq 60); do "$@" >/dev/null 2>&1 && return; sleep 0.5; done
  cannot "$name did not start (log: $STATE/$name.log)"
}
start_daemon slurmdbd "$STATE/slurmdbd.pid" sacctmgr -n list cluster
sacctmgr -i -Q add cluster moelab >/dev/null 2>&1 || true
sacctmgr -i -Q add account moelab Description=moe-lab-tests Organization=moe-lab >/dev/null 2>&1 || true
sacctmgr -i -Q add user root Account=moelab >/dev/null 2>&1 || true
start_daemon slurmctld "$STATE/slurmctld.pid" scontrol ping
start_daemon slurmd "$STATE/slurmd.pid" bash -c "sinfo -h -o %t | grep -qE '^(idle|mix|alloc)'"
scontrol update NodeName=localhost State=RESUME >/dev/null 2>&1 || true
sacct -n -X -S now >/dev/null || cannot "sacct does not answer (log: $STATE/slurmdbd.log)"
say "up in $(( $(date +%s) - t0 )) s: $(sinfo -h -o '%P %D node(s) %c CPUs %m MB')"
