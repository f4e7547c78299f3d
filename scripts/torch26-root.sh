#!/usr/bin/env bash
# A Debian 13 (trixie) root with PyTorch 2.6 (python3-torch, libtorch-dev) and the SDK's build tools, so that
# every PyTorch-facing test runs against torch 2.6 as well as the host's torch 1.13.
#
#   scripts/torch26-root.sh              build the root if missing (idempotent), print its path
#   scripts/torch26-root.sh run CMD ...  run CMD inside the root (see below); the exit code is CMD's
#   scripts/torch26-root.sh path         print the path (exit 1 when the root is not built)
#
# Where: $DDPRUN_TORCH26_ROOT, default /var/cache/ddprun/torch26-root: outside the build tree, so that reruns
# and fresh clones on the same machine reuse it (about 3 GB, built in a few minutes from Debian's mirror).
# A root whose stamp does not match this script's package list is rebuilt. Needs root (debootstrap, chroot).
#
# `run` keeps the caller's PID, environment, network namespace and working directory: it enters a private
# mount namespace (unshare --mount), bind-mounts the host's /proc, /sys, /dev, /run, /tmp, /var/tmp, /root,
# /home, /work, /etc/hosts, the repository, the current directory and $DDPRUN_CCACHE_DIR (the compiler cache
# the host's builds share, when set) onto the same paths in the root, and execs CMD there. So a worker started as `torch26-python train.py` is the very process ddprun spawned.
#
# Debian's torch 2.6 is built without libuv but defaults TCPStore(use_libuv=True): every TCPStore (torchrun's
# included) fails with "use_libuv was requested but PyTorch was build without libuv support". The root gets
# a small import hook (ddprun_torch_no_libuv.pth) that makes use_libuv=False the default; docs/migrating-from-
# torchrun.md describes the same fix for users of Debian 13.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
root=${DDPRUN_TORCH26_ROOT:-/var/cache/ddprun/torch26-root}
suite=trixie
packages=python3-torch,libtorch-dev,g++,cmake,ninja-build,pkg-config,libboost-dev
packages+=,libboost-system-dev,nlohmann-json3-dev,libcli11-dev,libspdlog-dev,libfmt-dev,catch2,ccache
# python3-etcd: torch's etcd and etcd-v2 rendezvous backends (tests/integration/test_etcd_netns.py) import it;
# libssl-dev: the project's configure needs OpenSSL (rendezvous/etcd's https), also for the SDK's build here.
packages+=,python3-etcd,libssl-dev
# prometheus-cpp-dev: the agent's metrics (agent/observe/); libmunge-dev: the store's MUNGE handshake.
packages+=,prometheus-cpp-dev,libmunge-dev
stamp_text="$suite $packages shim-v1"

die() {
  echo "torch26-root: $*" >&2
  exit 1
}

mirror() {
  # The Debian mirror this machine's apt already uses: the first URI of a deb822 stanza (sources.list.d/
  # *.sources) or a one-line `deb` entry (sources.list, sources.list.d/*.list) whose suite is a Debian release
  # (bookworm, trixie, ..., stable, sid; not -security). Nothing is guessed: no mirror, no root (the message
  # says where we looked); $DDPRUN_DEBIAN_MIRROR names one explicitly.
  if [[ -n ${DDPRUN_DEBIAN_MIRROR:-} ]]; then
    echo "$DDPRUN_DEBIAN_MIRROR"
    return
  fi
  local files=() f found
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] && files+=("$f")
  done
  ((${#files[@]} > 0)) || die "no apt sources on this machine (/etc/apt/sources.list, /etc/apt/sources.list.d/): cannot tell which Debian mirror to build the torch 2.6 root from; name one with DDPRUN_DEBIAN_MIRROR=URL"
  found=$(awk '
    function release(suite) { return suite ~ /^(buster|bullseye|bookworm|trixie|forky|sid|stable|testing|unstable|oldstable)(-updates)?$/ }
    FNR == 1 { uris = ""; suites = "" }
    # deb822: a stanza is a run of non-blank lines
    /^[ \t]*$/ { uris = ""; suites = ""; next }
    /^URIs:/ { uris = $2 }
    /^Suites:/ { for (i = 2; i <= NF; i++) if (release($i)) suites = $i }
    /^URIs:|^Suites:/ { if (uris != "" && suites != "") { print uris; exit } }
    # one-line: deb [options] URI suite components
    /^deb[ \t]/ {
      i = 2
      if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
      if (release($(i + 1))) { print $i; exit }
    }' "${files[@]}" 2>/dev/null) || true
  [[ -n $found ]] || die "no Debian release mirror in this machine's apt sources (${files[*]}): cannot tell where to debootstrap the torch 2.6 root from; add one there, or name one with DDPRUN_DEBIAN_MIRROR=URL"
  echo "$found"
}

install_shim() {
  local site=$1/usr/lib/python3/dist-packages
  [[ -d $site ]] || die "no $site in the new root"
  cp "$repo/scripts/torch26/ddprun_torch_no_libuv.py" "$site/"
  echo "import ddprun_torch_no_libuv" >"$site/ddprun_torch_no_libuv.pth"
}

build() {
  [[ $(id -u) -eq 0 ]] || die "building the root needs root (debootstrap); run as root"
  command -v debootstrap >/dev/null || {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q --no-install-recommends debootstrap
  }
  local tmp=$root.tmp
  rm -rf "$tmp"
  mkdir -p "$(dirname "$root")"
  local from
  from=$(mirror)
  echo "torch26-root: building $root (debootstrap $suite from $from, this machine's apt mirror; a few minutes)" >&2
  if ! debootstrap --variant=minbase --include="$packages" "$suite" "$tmp" "$from" >"$tmp.log" 2>&1; then
    tail -n 20 "$tmp.log" >&2
    die "debootstrap failed (log: $tmp.log)"
  fi
  install_shim "$tmp"
  mkdir -p "$tmp/work" "$tmp/home"
  echo "$stamp_text" >"$tmp/.ddprun-stamp"
  rm -rf "$root"
  mv "$tmp" "$root"
  rm -f "$tmp.log"
}

ensure() {
  if [[ -f $root/.ddprun-stamp && $(cat "$root/.ddprun-stamp") == "$stamp_text" ]]; then
    # The shim is the repository's: keep the root's copy current without a rebuild.
    cmp -s "$repo/scripts/torch26/ddprun_torch_no_libuv.py" \
      "$root/usr/lib/python3/dist-packages/ddprun_torch_no_libuv.py" || install_shim "$root"
    return
  fi
  build
}

run_inside() {
  [[ -f $root/.ddprun-stamp ]] || die "no torch 2.6 root at $root; build it with scripts/torch26-root.sh"
  (($# > 0)) || die "usage: torch26-root.sh run CMD [ARGS...]"
  # Inside a fresh mount namespace: bind the host paths, then chroot, cd and exec (PID unchanged).
  local binds=(/proc /sys /dev /run /tmp /var/tmp /root /home /work "$repo" "$PWD")
  if [[ -n ${DDPRUN_CCACHE_DIR:-} ]]; then
    mkdir -p "$DDPRUN_CCACHE_DIR"
    binds+=("$DDPRUN_CCACHE_DIR")
  fi
  exec unshare --mount --propagation private -- /bin/sh -c '
    root=$1; cwd=$2; shift 2
    while [ "$1" != "--" ]; do
      if [ -d "$1" ]; then
        mkdir -p "$root$1" && mount --rbind "$1" "$root$1" || exit 125
      fi
      shift
    done
    shift
    mount --bind /etc/hosts "$root/etc/hosts" 2>/dev/null || true
    mount --bind /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    exec chroot "$root" /bin/sh -c '\''cd "$1" || exit 125; shift; exec "$@"'\'' sh "$cwd" "$@"
  ' sh "$root" "$PWD" "${binds[@]}" -- "$@"
}

case ${1:-ensure} in
  ensure)
    ensure
    echo "$root"
    ;;
  path)
    [[ -f $root/.ddprun-stamp ]] || exit 1
    echo "$root"
    ;;
  run)
    shift
    run_inside "$@"
    ;;
  *) die "unknown command '$1' (ensure, path, run)" ;;
esac
