#!/usr/bin/env bash
# Installs everything ddprun needs to build, test and benchmark, from Debian packages only.
# Idempotent: packages already present are skipped by apt-get; safe to run again.
#   scripts/install-deps.sh            build + test dependencies
#   DDPRUN_DEPS_SLURM=1 scripts/install-deps.sh   also Slurm and munge (cluster tests)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ccache
  libboost-dev libboost-system-dev
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev catch2
  # the agent's metrics (prometheus-cpp); the tests scrape them with a real Prometheus and check them with
  # promtool (prometheus), and drive `ddprun status --watch` in tmux
  prometheus-cpp-dev prometheus tmux
  libtorch-dev python3-torch
  clang libclang-rt-14-dev
  iproute2 procps psmisc
  debootstrap util-linux
  # rendezvous/etcd: OpenSSL for https; the etcd rendezvous tests run real etcd members (python-etcd for
  # torchrun's etcd backends) with certificates made by the openssl CLI
  libssl-dev etcd-server etcd-client python3-etcd openssl
  # the store's handshake under Slurm: MUNGE credentials (rendezvous/auth/munge_auth.h); its tests run a
  # private munged
  libmunge-dev munge
)
if [[ "${DDPRUN_DEPS_SLURM:-0}" == 1 ]]; then
  packages+=(slurm-wlm munge)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
