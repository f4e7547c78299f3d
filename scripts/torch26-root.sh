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

# shellcheck source=scripts/debian-root.sh
. "$repo/scripts/debian-root.sh"
DEBIAN_ROOT_WHO=torch26-root

die() {
  debian_root_die "$@"
}

install_shim() {
  local site=$1/usr/lib/python3/dist-packages
  [[ -d $site ]] || die "no $site in the new root"
  cp "$repo/scripts/torch26/ddprun_torch_no_libuv.py" "$site/"
  echo "import ddprun_torch_no_libuv" >"$site/ddprun_torch_no_libuv.pth"
}

ensure() {
  if [[ -f $root/.ddprun-stamp && $(cat "$root/.ddprun-stamp") == "$stamp_text" ]]; then
    # The shim is the repository's: keep the root's copy current without a rebuild.
    cmp -s "$repo/scripts/torch26/ddprun_torch_no_libuv.py" \
      "$root/usr/lib/python3/dist-packages/ddprun_torch_no_libuv.py" || install_shim "$root"
    return
  fi
  DEBIAN_ROOT_HOOK=finish_root debian_root_ensure "$root" "$suite" "$packages" "$stamp_text"
}

finish_root() {
  install_shim "$1"
  mkdir -p "$1/work" "$1/home"
}

run_inside() {
  [[ -f $root/.ddprun-stamp ]] || die "no torch 2.6 root at $root; build it with scripts/torch26-root.sh"
  (($# > 0)) || die "usage: torch26-root.sh run CMD [ARGS...]"
  local binds=(/tmp /var/tmp /root /home /work "$repo" "$PWD")
  if [[ -n ${DDPRUN_CCACHE_DIR:-} ]]; then
    mkdir -p "$DDPRUN_CCACHE_DIR"
    binds+=("$DDPRUN_CCACHE_DIR")
  fi
  debian_root_run "$root" "${binds[@]}" -- "$@"
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
