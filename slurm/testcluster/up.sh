#!/usr/bin/env bash
# Start a real single-node Slurm cluster on loopback (munge + mariadb + slurmdbd
# + slurmctld + slurmd) for the test suite and CI.  Idempotent: a second call
# that finds a healthy cluster exits 0 at once.  See README.md beside this file.
#
# Usage: slurm/testcluster/up.sh [--fresh | --install]
#   --fresh   stop everything and wipe the state dir first (new DB, job ids from 1)
#   --install install the packages and the munge key, start nothing (CI does it before it
#             records the machine's state, so the suite itself changes nothing outside /tmp)
# Env:
#   MOR_SLURM_STATE    state dir (default /tmp/mor-slurm): config, logs, spool, DB
#   MOR_SLURM_TIMEOUT  seconds to wait for each daemon to come up (default 90)
#   MOR_SLURM_GPUS     GPUs the node advertises (GRES gpu, no real devices; default 4, 0: none)
# Exit codes: 0 up; 2 not root; 3 packages missing and cannot be installed;
#             1 any other failure (daemon log tails are printed to stderr).
set -euo pipefail

STATE=${MOR_SLURM_STATE:-/tmp/mor-slurm}
TIMEOUT=${MOR_SLURM_TIMEOUT:-90}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PKGS=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
BINS=(slurmctld slurmd slurmdbd sbatch sacct sacctmgr sinfo scancel munged munge mariadbd mariadb-install-db mariadb)
DB_USER=slurm
DB_PASS=mor-testcluster
DB_NAME=slurm_acct_db
CLUSTER=mor

log() { echo "[testcluster] $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  log "must run as root (it installs packages and starts daemons)"
  exit 2
fi

INSTALL_ONLY=""
case "${1:-}" in
  --install) INSTALL_ONLY=1 ;;
  --fresh)
    bash "$HERE/down.sh"
    case "$STATE" in /|"") log "refusing to wipe STATE=$STATE"; exit 1 ;; esac
    rm -rf "$STATE" ;;
esac

# ---------------------------------------------------------------- packages --
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
missing_pkgs() {
  local p
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "install ok installed" || return 0
  done
  for p in "${BINS[@]}"; do command -v "$p" >/dev/null || return 0; done
  return 1
}
if missing_pkgs; then
  if ! command -v apt-get >/dev/null; then
    log "packages missing (${PKGS[*]}) and no apt-get to install them"
    exit 3
  fi
  log "installing ${PKGS[*]} ..."
  export DEBIAN_FRONTEND=noninteractive
  # Keep the packages' init scripts from starting system daemons (no systemd
  # here, so invoke-rc.d would otherwise run /etc/init.d/* on install).
  POLICY_ADDED=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    POLICY_ADDED=1
  fi
  apt_install() { apt-get install -y --no-install-recommends "${PKGS[@]}" >"/tmp/mor-slurm-apt.log" 2>&1; }
  rc=0
  apt_install || { apt-get update >>"/tmp/mor-slurm-apt.log" 2>&1 && apt_install; } || rc=$?
  [ -n "$POLICY_ADDED" ] && rm -f /usr/sbin/policy-rc.d
  if [ "$rc" != 0 ] || missing_pkgs; then
    log "apt-get install failed (rc=$rc); tail of /tmp/mor-slurm-apt.log:"
    tail -n 20 /tmp/mor-slurm-apt.log >&2 || true
    exit 3
  fi
fi

# the munge key belongs to the installation (the package makes one, mode 600; an image may
# lack it), and so do its owner and mode: the cluster's start below sets them again, and a
# change there during a test session would be a file the session changed (tests/helpers/machine_state.py)
if id munge >/dev/null 2>&1; then
  if [ ! -s /etc/munge/munge.key ]; then
    install -d -o munge -g munge -m 700 /etc/munge
    log "creating /etc/munge/munge.key"
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
fi
if [ -n "$INSTALL_ONLY" ]; then
  log "packages installed; nothing started"
  exit 0
fi

# ----------------------------------------------------------------- helpers --
RUN=$STATE/run          # our pid records (root)
LOGS=$STATE/log         # daemon logs (root; munged logs in $STATE/munge)
ETC=$STATE/etc
export SLURM_CONF=$ETC/slurm.conf
MYSQL_SOCK=$STATE/mysql/mysqld.sock

# comm name the kernel reports for each daemon we start
declare -A COMM=([munged]=munged [mariadbd]=mariadbd [slurmdbd]=slurmdbd [slurmctld]=slurmctld [slurmd]=slurmd)

# alive NAME: recorded pid exists, is not a zombie, and is the right program
alive() {
  local f=$RUN/$1.pid pid st
  [ -s "$f" ] || return 1
  pid=$(cat "$f")
  [ -r "/proc/$pid/stat" ] || return 1
  st=$(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
  [ "$st" != Z ] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "${COMM[$1]}" ]
}

# start_bg NAME CMD...: start detached (own session, no tty/stdin), record pid
start_bg() {
  local name=$1; shift
  setsid "$@" </dev/null >>"$LOGS/$name.out" 2>&1 &
  echo $! > "$RUN/$name.pid"
  log "started $name (pid $!)"
}

dump_logs() {
  local f
  for f in "$LOGS"/* "$STATE/munge/munged.log"; do
    [ -s "$f" ] || continue
    echo "----- tail of $f -----" >&2
    tail -n 25 "$f" >&2 || true
  done
}

fail() { log "ERROR: $*"; dump_logs; exit 1; }

# wait_for DESC CMD...: poll CMD until it succeeds, at most $TIMEOUT seconds
wait_for() {
  local desc=$1; shift
  local end=$((SECONDS + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || fail "timed out after ${TIMEOUT}s waiting for $desc"
    sleep 0.5
  done
}

munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

node_ready() {
  local st
  st=$(sinfo -h -n "$NODE" -o %t 2>/dev/null) || return 1
  case "$st" in idle|mix|mixed|alloc|allocated|comp|completing) return 0 ;; esac
  return 1
}
sacct_ok() { sacct -n -X -S now-5minutes -o JobID >/dev/null 2>&1; }
healthy() { munge_ok && node_ready && sacct_ok; }

# ------------------------------------------------------------------ config --
NODE=$(hostname -s 2>/dev/null || true)
[ -n "$NODE" ] || NODE=$(uname -n | cut -d. -f1)
CPUS=$(nproc)
MEM_MB=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
[ "$MEM_MB" -ge 1 ] || MEM_MB=1
GPUS=${MOR_SLURM_GPUS:-4}
case "$GPUS" in ''|*[!0-9]*) log "MOR_SLURM_GPUS=$GPUS is not a number"; exit 1 ;; esac

mkdir -p "$STATE" "$RUN" "$LOGS" "$ETC" "$STATE/ctld" "$STATE/spool"
chmod 755 "$STATE"   # mysql and munge must traverse it

# GPUs as a generic resource on a machine without any. Slurm 22.05's gres/gpu counts only GPUs
# with a File= (count-only "Name=gpu Count=N" registers 0 and the node goes INVAL) and wants each
# file to be a character device; it numbers a GPU by the digits that end the name
# (CUDA_VISIBLE_DEVICES, SLURM_JOB_GPUS). So $STATE/dev/nvidiaN are links to /dev/null: nothing
# is written outside the state dir, and nothing constrains devices here (task/none).
GRES_NODE="" GRES_TYPES=""
if [ "$GPUS" -gt 0 ]; then
  mkdir -p "$STATE/dev"
  for ((i = 0; i < GPUS; i++)); do
    [ "$(readlink "$STATE/dev/nvidia$i" 2>/dev/null)" = /dev/null ] || ln -sfn /dev/null "$STATE/dev/nvidia$i"
  done
  GRES_NODE=" Gres=gpu:$GPUS" GRES_TYPES="GresTypes=gpu"
fi

NEW=$(mktemp -d)
trap 'rm -rf "$NEW"' EXIT
cat > "$NEW/slurm.conf" <<EOF
# Managed by mor-repro slurm/testcluster/up.sh -- regenerated on every run.
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$RUN/slurmctld.pidfile
SlurmdPidFile=$RUN/slurmd.pidfile
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
$GRES_TYPES
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=10
InactiveLimit=0
OverTimeLimit=0
Waittime=0
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$NODE NodeAddr=127.0.0.1 NodeHostname=$NODE CPUs=$CPUS RealMemory=$MEM_MB$GRES_NODE State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
{
  echo "# Managed by mor-repro slurm/testcluster/up.sh -- regenerated on every run."
  if [ "$GPUS" -gt 0 ]; then echo "NodeName=$NODE Name=gpu File=$STATE/dev/nvidia[0-$((GPUS - 1))]"; fi
} > "$NEW/gres.conf"
cat > "$NEW/slurmdbd.conf" <<EOF
# Managed by mor-repro slurm/testcluster/up.sh -- regenerated on every run.
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
DebugLevel=info
LogFile=$LOGS/slurmdbd.log
PidFile=$RUN/slurmdbd.pidfile
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=$DB_NAME
EOF

ANY_ALIVE=""
for d in munged mariadbd slurmdbd slurmctld slurmd; do alive "$d" && ANY_ALIVE=1; done
CHANGED=""
for f in slurm.conf gres.conf slurmdbd.conf; do cmp -s "$NEW/$f" "$ETC/$f" || CHANGED=1; done

if [ -n "$CHANGED" ] && [ -n "$ANY_ALIVE" ]; then
  log "configuration changed; restarting the cluster"
  bash "$HERE/down.sh"
fi
if [ -n "$CHANGED" ]; then
  install -m 644 -o root -g root "$NEW/slurm.conf" "$ETC/slurm.conf"
  install -m 644 -o root -g root "$NEW/gres.conf" "$ETC/gres.conf"   # beside slurm.conf: where Slurm looks
  install -m 600 -o root -g root "$NEW/slurmdbd.conf" "$ETC/slurmdbd.conf"   # owner = SlurmUser
fi

# Clients find the config through SLURM_CONF (env.sh) and, unless the machine
# has a slurm.conf of its own, through /etc/slurm/slurm.conf -> $ETC/slurm.conf.
mkdir -p /etc/slurm
if [ -L /etc/slurm/slurm.conf ] || [ ! -e /etc/slurm/slurm.conf ]; then
  ln -sfn "$ETC/slurm.conf" /etc/slurm/slurm.conf
elif ! grep -q "Managed by mor-repro" /etc/slurm/slurm.conf; then
  log "note: /etc/slurm/slurm.conf belongs to someone else; clients need SLURM_CONF=$SLURM_CONF (source $STATE/env.sh)"
fi
cat > "$STATE/env.sh" <<EOF
# Source this to talk to the mor test cluster (written by slurm/testcluster/up.sh).
export SLURM_CONF=$ETC/slurm.conf
export MOR_SLURM_STATE=$STATE
EOF

# Fast path: everything we manage is running and the cluster answers.
ALL_ALIVE=1
for d in mariadbd slurmdbd slurmctld slurmd; do alive "$d" || ALL_ALIVE=""; done
if [ -n "$ALL_ALIVE" ] && healthy; then
  log "cluster '$CLUSTER' already up (node $NODE); source $STATE/env.sh"
  exit 0
fi

T0=$SECONDS
# ------------------------------------------------------------------- munge --
if ! munge_ok; then
  id munge >/dev/null 2>&1 || fail "no 'munge' user (is the munge package installed?)"
  install -d -o munge -g munge -m 700 /etc/munge "$STATE/munge"
  install -d -o munge -g munge -m 755 /run/munge
  install -d -o munge -g munge -m 711 /var/lib/munge
  if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
  alive munged && kill "$(cat "$RUN/munged.pid")" 2>/dev/null && sleep 1
  # seed and pid files in the state dir: nothing outside it and /run is left changed
  start_bg munged setpriv --reuid=munge --regid=munge --init-groups \
    munged --foreground --force --log-file="$STATE/munge/munged.log" \
    --seed-file="$STATE/munge/munged.seed" --pid-file="$STATE/munge/munged.pid"
  wait_for "munged (munge -n | unmunge)" munge_ok
fi

# ----------------------------------------------------------------- mariadb --
mysql_ok() { mariadb --no-defaults --socket="$MYSQL_SOCK" -uroot -N -e 'SELECT 1'; }
if ! alive mariadbd; then
  install -d -o mysql -g mysql -m 750 "$STATE/mysql"
  if [ ! -d "$STATE/mysql/data/mysql" ]; then
    log "initialising MariaDB datadir $STATE/mysql/data"
    rm -rf "$STATE/mysql/data"
    mariadb-install-db --no-defaults --user=mysql --datadir="$STATE/mysql/data" \
      --auth-root-authentication-method=socket --skip-test-db \
      >"$LOGS/mariadb-install-db.log" 2>&1 || fail "mariadb-install-db failed"
  fi
  start_bg mariadbd mariadbd --no-defaults --user=mysql --datadir="$STATE/mysql/data" \
    --socket="$MYSQL_SOCK" --pid-file="$STATE/mysql/mysqld.pid" --skip-networking \
    --skip-log-bin --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 \
    --max-connections=100 --log-warnings=1
fi
wait_for "mariadbd on $MYSQL_SOCK" mysql_ok
mariadb --no-defaults --socket="$MYSQL_SOCK" -uroot -e "
  CREATE DATABASE IF NOT EXISTS $DB_NAME;
  CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
  ALTER USER '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
  GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'localhost';
  FLUSH PRIVILEGES;" || fail "could not create the slurm DB user"

# ---------------------------------------------------------------- slurmdbd --
sacctmgr_ok() { sacctmgr -n -P list cluster format=cluster; }
if ! alive slurmdbd; then
  # the mysql plugin connects to "localhost", i.e. the socket in MYSQL_UNIX_PORT
  start_bg slurmdbd env MYSQL_UNIX_PORT="$MYSQL_SOCK" slurmdbd -D
fi
wait_for "slurmdbd (sacctmgr list cluster)" sacctmgr_ok
if ! sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER"; then
  sacctmgr -i add cluster "$CLUSTER" >/dev/null || fail "sacctmgr add cluster $CLUSTER failed"
fi

# --------------------------------------------------------- slurmctld/slurmd --
alive slurmctld || start_bg slurmctld slurmctld -D -i
wait_for "slurmctld (scontrol ping)" bash -c 'scontrol ping | grep -q "is UP"'
alive slurmd || start_bg slurmd slurmd -D -N "$NODE"

# Node must become usable; resume it once if it came up DOWN/DRAINED from an
# earlier run (ReturnToService=2 covers most cases).
end=$((SECONDS + TIMEOUT)); resumed=""
until node_ready; do
  [ $SECONDS -lt $end ] || fail "timed out after ${TIMEOUT}s waiting for node $NODE to be idle (sinfo: $(sinfo -h -N -o '%N %t %E' 2>&1 | tr '\n' ' '))"
  st=$(sinfo -h -n "$NODE" -o %t 2>/dev/null || true)
  case "$st" in
    down*|drain*|drng*|fail*)
      if [ -z "$resumed" ] && [ $((SECONDS - T0)) -gt 3 ]; then
        log "node $NODE is $st ($(sinfo -h -n "$NODE" -o %E)); resuming"
        scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true
        resumed=1
      fi ;;
  esac
  sleep 0.5
done
wait_for "sacct" sacct_ok
log "cluster '$CLUSTER' up in $((SECONDS - T0))s (node $NODE, $CPUS CPUs, ${MEM_MB} MB); source $STATE/env.sh"
