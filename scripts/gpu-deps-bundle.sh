#!/usr/bin/env bash
# The build dependencies of ddprun as one archive, for a GPU machine that has CUDA, NCCL, a compiler, CMake
# and a CUDA build of torch but no Debian packages and no network (the device tool's H200 image). Packs this
# machine's Debian 12 packages of the dependencies (headers, shared libraries, CMake packages; no static
# libraries, no docs) into one xz tarball of a /usr tree; scripts/gpu-checks.sh unpacks it into a prefix of
# its own and builds against it (CMAKE_PREFIX_PATH). The libraries are Debian 12's (glibc 2.36): they run
# where glibc is 2.36 or newer (Ubuntu 24.04: 2.39).
#
#   scripts/gpu-deps-bundle.sh OUT.tar.xz
#
# Exit status: 0 when the archive was written; 1 when a package is not installed (scripts/install-deps.sh).
set -euo pipefail

out=${1:?usage: scripts/gpu-deps-bundle.sh OUT.tar.xz}
packages=(libboost1.74-dev libboost-system1.74-dev libboost-system1.74.0 nlohmann-json3-dev libcli11-dev
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 prometheus-cpp-dev libprometheus-cpp-core1.0
  libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0 libcivetweb-dev libcivetweb1 civetweb libssl-dev libssl3
  libmunge-dev libmunge2 catch2 zlib1g-dev)
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || {
    echo "gpu-deps-bundle: package $p is not installed (scripts/install-deps.sh installs it)" >&2
    exit 1
  }
done

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
# Files and links of the packages, without documentation and static libraries (but Catch2's main).
dpkg -L "${packages[@]}" | grep -v -E '^/usr/share/(doc|man|lintian|bug)/' | grep -v -E '/lib[^C/][^/]*\.a$' | sort -u |
  while read -r f; do [[ -d $f && ! -L $f ]] || echo "${f#/}"; done >"$root/files"
tar -C / -cf - -T "$root/files" | tar -C "$root" -xf -
rm "$root/files"
# zlib's development link points at the full path of this machine's libz: point it at the soname instead.
ln -sf /lib/x86_64-linux-gnu/libz.so.1 "$root/usr/lib/x86_64-linux-gnu/libz.so"
# prometheus-cpp's package asks for CURL (its push library, which ddprun does not use): not there.
sed -i 's/^set(PROMETHEUS_CPP_ENABLE_PUSH ON)/set(PROMETHEUS_CPP_ENABLE_PUSH OFF)/' \
  "$root/usr/lib/x86_64-linux-gnu/cmake/prometheus-cpp/prometheus-cpp-config.cmake"
tar -C "$root" -cf - usr | xz -T0 -4 >"$out"
echo "gpu-deps-bundle: $out ($(du -h "$out" | cut -f1)): ${#packages[@]} packages of $(. /etc/os-release && echo "$PRETTY_NAME")"
