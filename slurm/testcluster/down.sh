#!/usr/bin/env bash
# Stop the single-node Slurm test cluster started by up.sh: cancel its jobs,
# then stop slurmd, slurmctld, slurmdbd, mariadbd and munged by the PIDs that
# up.sh recorded in $MOR_SLURM_STATE/run, waiting for each to exit; then remove the
# /etc/slurm/slurm.conf link up.sh made.
# Idempotent; keeps the state dir (config, logs, DB, job-id counter).
set -uo pipefail

STATE=${MOR_SLURM_STATE:-/tmp/mor-slurm}
RUN=$STATE/run
export SLURM_CONF=$STATE/etc/slurm.conf
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
STOP_WAIT=${MOR_SLURM_STOP_WAIT:-20}

log() { echo "[testcluster] $*" >&2; }
[ -d "$RUN" ] || exit 0

declare -A COMM=([munged]=munged [mariadbd]=mariadbd [slurmdbd]=slurmdbd [slurmctld]=slurmctld [slurmd]=slurmd)

# is_running PID COMM: alive, not a zombie, and running the expected program
is_running() {
  local pid=$1 st
  [ -r "/proc/$pid/stat" ] || return 1
  st=$(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
  [ "$st" != Z ] || return 1
  [ -z "${2:-}" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]
}

# stop PID COMM: SIGTERM, wait up to STOP_WAIT s, then SIGKILL
stop_pid() {
  local pid=$1 comm=${2:-} i
  is_running "$pid" "$comm" || return 0
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < STOP_WAIT * 5; i++)); do
    is_running "$pid" "$comm" || return 0
    sleep 0.2
  done
  log "pid $pid ($comm) ignored SIGTERM for ${STOP_WAIT}s; killing"
  kill -KILL "$pid" 2>/dev/null
  for ((i = 0; i < 25; i++)); do is_running "$pid" "$comm" || return 0; sleep 0.2; done
}

pid_of() { [ -s "$RUN/$1.pid" ] && cat "$RUN/$1.pid"; }

# 1. cancel every job while slurmctld still runs, so no job steps outlive it
ctld=$(pid_of slurmctld)
if [ -n "$ctld" ] && is_running "$ctld" slurmctld; then
  jobs=$(timeout 10 squeue -h -o %A 2>/dev/null)
  if [ -n "$jobs" ]; then
    log "cancelling jobs: $(echo $jobs)"
    timeout 10 scancel $jobs 2>/dev/null
    for ((i = 0; i < 75; i++)); do
      [ -z "$(timeout 5 squeue -h -t R,CG,S -o %A 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
fi

# 2. daemons, clients first
for name in slurmd slurmctld slurmdbd mariadbd munged; do
  pid=$(pid_of "$name") || continue
  if is_running "$pid" "${COMM[$name]}"; then
    log "stopping $name (pid $pid)"
    stop_pid "$pid" "${COMM[$name]}"
  fi
  rm -f "$RUN/$name.pid"
done

# 3. job step daemons left behind by a killed slurmd (this is a test machine:
#    any slurmstepd here belongs to the test cluster)
for p in /proc/[0-9]*; do
  [ "$(readlink "$p/exe" 2>/dev/null)" = /usr/sbin/slurmstepd ] || continue
  log "killing leftover slurmstepd ${p#/proc/}"
  stop_pid "${p#/proc/}" slurmstepd
done

# 4. the client config link up.sh made (it would dangle once /tmp is cleaned)
if [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$STATE/etc/slurm.conf" ]; then
  rm -f /etc/slurm/slurm.conf
fi
exit 0
