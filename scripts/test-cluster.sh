#!/usr/bin/env bash
# test-cluster.sh: N test "hosts" on one Linux machine, as network namespaces on a bridge (iproute2 only).
#
#   scripts/test-cluster.sh up N          create hosts 1..N (idempotent; hosts above N are removed)
#   scripts/test-cluster.sh exec I CMD... run CMD on host I (its network, its own host name ddprun-hI)
#   scripts/test-cluster.sh names N1 N2.. name host 1 N1, host 2 N2, ...: resolvable on every host, and each
#                                         one's host name (Kubernetes pods by their pod names)
#   scripts/test-cluster.sh down          kill every process left on the hosts, delete hosts, veths, bridge
#   scripts/test-cluster.sh status        list the hosts, their addresses and how many processes run there
#
# Layout: bridge ddprun-br0 with 10.99.0.254/24 in the root namespace; host I is namespace ddprun-hI with
# loopback up and interface eth0 = 10.99.0.I/24, the peer of veth ddprun-vI on the bridge. The hosts have no
# default route: they reach each other (and the bridge address) and nothing else. Host names are not
# resolvable (use the 10.99.0.I addresses) unless `names` gave them names: then every host's /etc/hosts (the
# file /etc/netns/ddprun-hI/hosts, which `ip netns exec` mounts over /etc/hosts) lists them, and `exec` on
# host I sets its host name to its name; `down` (or `up`, for hosts it removes) deletes those files.
#
# Host sets: DDPRUN_TEST_HOSTS=S (1..9; default 0, the layout above) makes and uses another set of hosts that
# shares nothing with the others - namespaces ddprun-sShI, bridge ddprun-sSbr with 10.99.S.254/24, veths
# ddprun-sSvI, host I at 10.99.S.I - so that two users (two test modules) can each have hosts at once. The
# hosts' own names are ddprun-hI in every set. `down` removes its own set only.
#
# `exec` runs CMD through `ip netns exec` (which remounts /sys; fine for plain processes - a Slurm daemon
# needs nsenter instead) and `unshare --uts`, so gethostname() returns ddprun-hI on host I. It exports
# GLOO_SOCKET_IFNAME=eth0 unless set: gloo otherwise picks its interface by resolving the host name. CMD keeps
# the process id of the `exec` call (every step execs), so signalling that pid signals CMD.
#
# The host names are fixed, so one user at a time: users that keep the hosts for a while (the test module
# tests/integration/test_elastic_netns.py, a Slurm test cluster) hold an flock on
# /tmp/ddprun-test-cluster.lock meanwhile. This script itself does not lock.
#
# Needs root (exit 77 without it, the "skipped" code of automake and ctest's SKIP_RETURN_CODE). A failed `up`
# tears down what it created. Exit codes: 0 ok, 1 failure, 2 usage, 77 not root / no netns support.
set -Eeuo pipefail

readonly SET=${DDPRUN_TEST_HOSTS:-0}
if ! [[ $SET =~ ^[0-9]$ ]]; then
  echo "test-cluster: DDPRUN_TEST_HOSTS must be a host set 0..9 (got '$SET')" >&2
  exit 2
fi
if ((SET == 0)); then
  readonly PREFIX=ddprun-h BRIDGE=ddprun-br0 VETH_PREFIX=ddprun-v
else
  readonly PREFIX=ddprun-s${SET}h BRIDGE=ddprun-s${SET}br VETH_PREFIX=ddprun-s${SET}v
fi
readonly SUBNET=10.99.$SET
readonly BRIDGE_ADDR=$SUBNET.254/24
readonly MAX_HOSTS=200  # 10.99.0.1 .. 10.99.0.200; .201-.253 stay free for "nobody there" tests

usage() {
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

die() {
  echo "test-cluster: $*" >&2
  exit 1
}

need_root() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "test-cluster: needs root (network namespaces, bridge, veth); run it with sudo" >&2
    exit 77
  fi
  command -v ip >/dev/null || { echo "test-cluster: iproute2 ('ip') is not installed" >&2; exit 77; }
}

hosts() {  # the ddprun-h* namespaces that exist, by number
  ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^${PREFIX}\([0-9][0-9]*\)$/\1/p" | sort -n
}

link_exists() { ip link show "$1" >/dev/null 2>&1; }

kill_host_processes() {  # SIGKILLs every process in namespace $1 and waits (bounded) until they are gone
  local ns=$1 pids attempt
  for attempt in $(seq 1 50); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -z $pids ]] && return 0
    # shellcheck disable=SC2086  # one pid per word
    kill -KILL $pids 2>/dev/null || true
    [[ $attempt -eq 1 ]] && echo "test-cluster: killed $(wc -w <<<"$pids") process(es) left on $ns" >&2
    sleep 0.1
  done
  echo "test-cluster: processes still in $ns after SIGKILL: $(ip netns pids "$ns" | tr '\n' ' ')" >&2
  return 1
}

remove_host() {
  local i=$1 ns=$PREFIX$1
  kill_host_processes "$ns" || true
  rm -rf "/etc/netns/$ns"
  ip netns delete "$ns" 2>/dev/null || true  # deleting the namespace deletes eth0 and with it its peer
  if link_exists "$VETH_PREFIX$i"; then ip link delete "$VETH_PREFIX$i" 2>/dev/null || true; fi
}

cmd_down() {
  local i veth
  for i in $(hosts); do remove_host "$i"; done
  # veths whose namespace vanished some other way
  for veth in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
    grep "^${VETH_PREFIX}[0-9]" || true); do
    ip link delete "$veth" 2>/dev/null || true
  done
  if link_exists "$BRIDGE"; then ip link delete "$BRIDGE" type bridge; fi
  rm -rf /etc/netns/"$PREFIX"[0-9]*  # names of hosts whose namespace vanished some other way
  [[ -z $(hosts) ]] || die "could not delete namespaces: $(hosts | tr '\n' ' ')"
}

add_host() {
  local i=$1 ns=$PREFIX$1 veth=$VETH_PREFIX$1
  hosts | grep -x "$i" >/dev/null || ip netns add "$ns"
  if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
    if link_exists "$veth"; then ip link delete "$veth"; fi
    ip link add "$veth" type veth peer name eth0 netns "$ns"
  fi
  ip link set "$veth" master "$BRIDGE" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr replace "$SUBNET.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
}

cmd_up() {
  local n=$1 i
  if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > MAX_HOSTS)); then
    die "up: N must be 1..$MAX_HOSTS (got '$n')"
  fi
  # A failure half-way leaves nothing behind.
  trap 'echo "test-cluster: up failed; tearing down" >&2; cmd_down || true' ERR
  if ! ip netns add "${PREFIX}probe$$" 2>/dev/null; then
    trap - ERR
    echo "test-cluster: cannot create network namespaces here (ip netns add failed)" >&2
    exit 77
  fi
  ip netns delete "${PREFIX}probe$$"
  if ! link_exists "$BRIDGE"; then ip link add "$BRIDGE" type bridge; fi
  ip addr replace "$BRIDGE_ADDR" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for i in $(hosts); do
    if ((i > n)); then remove_host "$i"; fi
  done
  for i in $(seq 1 "$n"); do add_host "$i"; done
  trap - ERR
  echo "test-cluster: $n host(s) up: $(for i in $(seq 1 "$n"); do printf '%s ' "$PREFIX$i=$SUBNET.$i"; done)"
}

cmd_exec() {
  local i=$1
  shift
  [[ $i =~ ^[0-9]+$ ]] || die "exec: host number expected (got '$i')"
  [[ $# -gt 0 ]] || usage
  hosts | grep -x "$i" >/dev/null || die "exec: host $i does not exist (run: $0 up N)"
  export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-eth0}
  local name=ddprun-h$i
  [[ -s /etc/netns/$PREFIX$i/hostname ]] && name=$(<"/etc/netns/$PREFIX$i/hostname")
  # shellcheck disable=SC2016  # $0 and $@ belong to the inner shell
  exec ip netns exec "$PREFIX$i" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

cmd_names() {
  local count i j
  count=$(hosts | wc -l)
  (($# <= count)) || die "names: $# names for $count host(s)"
  for name in "$@"; do
    [[ $name =~ ^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$ ]] || die "names: '$name' is not a host name"
  done
  for j in $(hosts); do
    mkdir -p "/etc/netns/$PREFIX$j"
    {
      echo "127.0.0.1 localhost"
      echo "::1 localhost ip6-localhost ip6-loopback"
      i=1
      for name in "$@"; do
        echo "$SUBNET.$i $name"
        i=$((i + 1))
      done
    } >"/etc/netns/$PREFIX$j/hosts"
    rm -f "/etc/netns/$PREFIX$j/hostname"
    if ((j <= $#)); then echo "${!j}" >"/etc/netns/$PREFIX$j/hostname"; fi
  done
}

cmd_status() {
  local i ns found=0
  if link_exists "$BRIDGE"; then
    echo "bridge $BRIDGE: $(ip -br addr show "$BRIDGE" | awk '{print $2, $3}')"
  else
    echo "bridge $BRIDGE: absent"
  fi
  for i in $(hosts); do
    found=1
    ns=$PREFIX$i
    echo "host $i: $ns $(ip -n "$ns" -br addr show eth0 2>/dev/null | awk '{print $2, $3}')" \
      "processes: $(ip netns pids "$ns" 2>/dev/null | wc -l)"
  done
  ((found)) || echo "no hosts"
}

[[ $# -ge 1 ]] || usage
sub=$1
shift
case $sub in
  up) [[ $# -eq 1 ]] || usage; need_root; cmd_up "$1" ;;
  down) [[ $# -eq 0 ]] || usage; need_root; cmd_down; echo "test-cluster: down" ;;
  exec) [[ $# -ge 2 ]] || usage; need_root; cmd_exec "$@" ;;
  names) [[ $# -ge 1 ]] || usage; need_root; cmd_names "$@" ;;
  status) [[ $# -eq 0 ]] || usage; need_root; cmd_status ;;
  -h | --help | help) usage ;;
  *) usage ;;
esac
