#!/usr/bin/env bash
# slurm-cluster.sh: a real Slurm cluster on one Linux machine, on the network-namespace hosts of test-cluster.sh.
#
#   scripts/slurm-cluster.sh up N      hosts 1..N (test-cluster.sh up N), munged, slurmctld, one slurmd per host;
#                                      returns when `sinfo` shows the N nodes idle
#   scripts/slurm-cluster.sh down      stop every daemon started by `up`, remove Slurm's state, the /etc/hosts
#                                      entries and the hosts (test-cluster.sh down)
#   scripts/slurm-cluster.sh install   only install slurm-wlm and munge when missing (as `up` does)
#   scripts/slurm-cluster.sh status    daemons, `sinfo`
#   eval "$(scripts/slurm-cluster.sh env)"   SLURM_CONF for sbatch/srun/squeue/scancel in this shell
#
# Layout: Slurm nodes n1..nN are hosts ddprun-h1..hN (NodeAddr=10.99.0.I); "nI" resolves through an /etc/hosts
# block marked "ddprun-slurm-cluster" (the hosts share the file system). slurmctld runs in the root namespace
# and listens on the bridge address 10.99.0.254 (SlurmctldHost=<this host name>(10.99.0.254)). Each slurmd runs
# in its host's network namespace through nsenter (not `ip netns exec`, which remounts /sys and hides the cgroup
# file system) and its own UTS namespace with host name nI, so that jobs see SLURMD_NODENAME=nI and
# gethostname()=nI. munged is private to this cluster (its own key and socket, AuthInfo=socket=...), so a
# system-wide munge or Slurm is neither needed nor touched. Plugins: proctrack/linuxproc, task/none, no
# accounting; KillWait=5 s (scancel: SIGTERM, 5 s grace, SIGKILL). Jobs run as root.
#
# `up` starts from a clean slate: the daemons of an earlier `up` (found by their pid files) are stopped and the
# hosts are recreated (test-cluster.sh down, then up), so nothing an earlier, interrupted run left on them (a
# slurmstepd, a job's processes) survives. Start-up waits are bounded by DDPRUN_SLURM_START_TIMEOUT seconds each
# (default 180: a loaded 2-core machine is slow, an idle one takes ~2 s in all) and end at once, with the
# daemon's log, when a daemon exits.
#
# State: everything lives in $DDPRUN_SLURM_DIR (default /tmp/ddprun-slurm): slurm.conf, logs (slurmctld.log,
# slurmd-nI.log, munged.log), spool and state directories, pid files. Installs slurm-wlm and munge with apt-get
# when they are missing (scripts/install-deps.sh with DDPRUN_DEPS_SLURM=1).
#
# Needs root (exit 77 without it, or when the hosts cannot be created, or Slurm is missing and cannot be
# installed): 77 means "this machine cannot run a Slurm cluster". Exit codes: 0 ok, 1 failure (the cluster should
# have started: the message and the daemons' last log lines say why), 2 usage, 77 cannot run here. A failed `up`
# runs `down`.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly HERE
readonly CLUSTER=$HERE/test-cluster.sh
readonly DIR=${DDPRUN_SLURM_DIR:-/tmp/ddprun-slurm}
readonly CONF=$DIR/slurm.conf
readonly SUBNET=10.99.0
readonly CTLD_ADDR=$SUBNET.254
readonly HOSTS_MARK="# ddprun-slurm-cluster"
readonly NODE_CPUS=4
readonly START_TIMEOUT=${DDPRUN_SLURM_START_TIMEOUT:-180}
export SLURM_CONF=$CONF

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

log() { echo "slurm-cluster: $*" >&2; }
die() {
  log "$*"
  exit 1
}

need_root() {
  if [[ $(id -u) -ne 0 ]]; then
    log "needs root (namespaces, daemons, /etc/hosts); run it with sudo"
    exit 77
  fi
}

install_slurm() {
  local missing=() p
  for p in slurm-wlm munge; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  command -v apt-get >/dev/null || { log "slurm-wlm/munge missing and no apt-get to install them"; exit 77; }
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends "${missing[@]}" >/dev/null; } || { log "could not install ${missing[*]}"; exit 77; }
}

pid_alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }

read_pid() { if [[ -f $1 ]]; then cat "$1" 2>/dev/null || true; fi; }

# Closes every file descriptor above 2 of this shell: a daemon must not inherit, say, a test's lock file.
close_fds() {
  local fd
  for fd in "/proc/$BASHPID/fd/"*; do
    fd=${fd##*/}
    ((fd > 2)) && eval "exec $fd>&-" 2>/dev/null
  done
  return 0
}

# Pid files of the daemons spawned by this `up`: a wait ends as soon as one of them has exited.
spawned=()

# Starts "$@" in the background, detached (own session, no terminal), output to log file $1; writes the pid to $2.
spawn() {
  local logfile=$1 pidfile=$2
  shift 2
  (close_fds && exec setsid "$@" </dev/null >>"$logfile" 2>&1) &
  echo $! >"$pidfile"
  spawned+=("$pidfile")
}

dead_daemon() {  # prints the first spawned daemon that is no longer running (its pid file's name); 1 if none
  local f
  for f in "${spawned[@]}"; do
    pid_alive "$(read_pid "$f")" || { basename "$f" .daemon; return 0; }
  done
  return 1
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.2 s; 1 on timeout or a dead daemon
  local secs=$1 what=$2 deadline started=$SECONDS dead
  shift 2
  deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if dead=$(dead_daemon); then
      log "$dead exited while waiting for: $what"
      return 1
    fi
    ((SECONDS < deadline)) || { log "no '$what' after $secs s"; return 1; }
    sleep 0.2
  done
  log "$what ($((SECONDS - started)) s)"
}

set_etc_hosts() {  # rewrites /etc/hosts in place (it may be a bind mount): our block for n1..n$1, or none
  local n=${1:-0} kept i
  kept=$(grep -v -- "$HOSTS_MARK" /etc/hosts || true)
  {
    [[ -n $kept ]] && printf '%s\n' "$kept"
    for ((i = 1; i <= n; i++)); do printf '%s n%d %s\n' "$SUBNET.$i" "$i" "$HOSTS_MARK"; done
  } >/etc/hosts.ddprun-new
  cat /etc/hosts.ddprun-new >/etc/hosts
  rm -f /etc/hosts.ddprun-new
}

write_conf() {
  local n=$1 i host
  host=$(hostname -s)
  cat >"$CONF" <<EOF
# Written by scripts/slurm-cluster.sh; removed by its 'down'.
ClusterName=ddprun
SlurmctldHost=$host($CTLD_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/ctld-state
SlurmdSpoolDir=$DIR/spool-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait=5
InactiveLimit=0
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=60
EOF
  for ((i = 1; i <= n; i++)); do
    echo "NodeName=n$i NodeAddr=$SUBNET.$i NodeHostname=n$i CPUs=$NODE_CPUS State=UNKNOWN" >>"$CONF"
  done
  echo "PartitionName=debug Nodes=n[1-$n] Default=YES MaxTime=INFINITE State=UP" >>"$CONF"
}

start_munge() {
  mkdir -p "$DIR/munge"
  if [[ ! -s $DIR/munge/munge.key ]]; then
    head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
  fi
  chown -R munge:munge "$DIR/munge"
  chmod 0755 "$DIR/munge"  # munged insists that every client can reach its socket
  chmod 0400 "$DIR/munge/munge.key"
  (close_fds && exec runuser -u munge -- munged --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed") ||
    die "munged did not start (see $DIR/munge/munged.log)"
  wait_for "$START_TIMEOUT" "munged is up" munge -S "$DIR/munge/munge.socket" -n ||
    die "munged does not answer on $DIR/munge/munge.socket"
}

nodes_idle() {  # all $1 nodes idle?
  local states
  states=$(sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
  [[ $(grep -c ' idle$' <<<"$states") -eq $1 ]]
}

up_failed() {
  local f
  log "up failed; tearing down. Last log lines:"
  for f in "$DIR"/*.log "$DIR"/*.out "$DIR/munge/munged.log"; do
    [[ -s $f ]] && { echo "--- $f" >&2; tail -n 15 "$f" >&2; }
  done
  cmd_down || true
}

cmd_up() {
  local n=$1 i ns rc=0
  if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > 200)); then die "up: N must be 1..200 (got '$n')"; fi
  install_slurm
  # A clean slate: an earlier cluster's daemons, and whatever an interrupted run left on the hosts.
  stop_daemons
  bash "$CLUSTER" down >&2 || rc=$?
  ((rc == 0)) || { ((rc == 77)) && exit 77; die "test-cluster.sh down failed"; }
  bash "$CLUSTER" up "$n" >&2 || rc=$?
  if ((rc != 0)); then
    ((rc == 77)) && exit 77
    die "test-cluster.sh up $n failed"
  fi
  trap up_failed EXIT  # any failure from here on (die, set -e) tears everything down
  rm -rf "$DIR"
  mkdir -p "$DIR/ctld-state"
  set_etc_hosts "$n"
  write_conf "$n"
  start_munge
  spawn "$DIR/slurmctld.out" "$DIR/slurmctld.daemon" slurmctld -D -i -f "$CONF"
  wait_for "$START_TIMEOUT" "slurmctld is up" scontrol ping || die "slurmctld does not answer (see $DIR/slurmctld.log)"
  for ((i = 1; i <= n; i++)); do
    ns=/var/run/netns/ddprun-h$i
    [[ -e $ns ]] || die "host $i (namespace $ns) does not exist"
    # shellcheck disable=SC2016  # expanded by the inner shell
    spawn "$DIR/slurmd-n$i.out" "$DIR/slurmd-n$i.daemon" nsenter --net="$ns" unshare --uts -- \
      sh -c 'hostname "$0" && exec slurmd -D -N "$0" -f "$1"' "n$i" "$CONF"
  done
  wait_for "$START_TIMEOUT" "$n node(s) idle" nodes_idle "$n" || die "the nodes are not idle: $(sinfo -N 2>&1)"
  trap - EXIT
  sinfo >&2
}

stop_daemons() {  # SIGTERM, then SIGKILL after 5 s, every daemon whose pid file we wrote
  local f pids=() pid deadline
  for f in "$DIR"/slurmd-n*.daemon "$DIR/slurmctld.daemon" "$DIR/munge/munged.pid"; do
    pid=$(read_pid "$f")
    pid_alive "$pid" && pids+=("$pid")
  done
  ((${#pids[@]} == 0)) && return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  deadline=$((SECONDS + 5))
  for pid in "${pids[@]}"; do
    while pid_alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    if pid_alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
  log "stopped ${#pids[@]} daemon(s)"
}

cmd_down() {
  if [[ -d $DIR ]]; then
    # Jobs first, so that no slurmstepd is left behind (test-cluster.sh down kills what remains on the hosts).
    scancel --full --quiet --user=root >/dev/null 2>&1 || true
    stop_daemons
    rm -rf "$DIR"
  fi
  set_etc_hosts 0
  bash "$CLUSTER" down >&2 || true
}

cmd_status() {
  local f pid
  [[ -f $CONF ]] || { echo "no cluster ($CONF absent)"; return 0; }
  for f in "$DIR/munge/munged.pid" "$DIR/slurmctld.daemon" "$DIR"/slurmd-n*.daemon; do
    pid=$(read_pid "$f")
    printf '%-28s pid %-8s %s\n' "$(basename "$f")" "${pid:--}" "$(pid_alive "$pid" && echo running || echo stopped)"
  done
  sinfo -N 2>&1 || true
}

[[ $# -ge 1 ]] || usage
sub=$1
shift
case $sub in
  up) [[ $# -eq 1 ]] || usage; need_root; cmd_up "$1" ;;
  down) [[ $# -eq 0 ]] || usage; need_root; cmd_down; log "down" ;;
  install) [[ $# -eq 0 ]] || usage; need_root; install_slurm ;;
  status) [[ $# -eq 0 ]] || usage; cmd_status ;;
  env) [[ $# -eq 0 ]] || usage; echo "export SLURM_CONF=$CONF" ;;
  -h | --help | help) usage ;;
  *) usage ;;
esac
