#!/usr/bin/env bash
# The release: one portable build of ddprun, ddprun-store and ddprun-launch (x86-64 Linux, glibc >= 2.31, nothing
# else needed) and the four ways in made from it, into dist/ (packaging/README.md says what each holds):
#
#   dist/ddprun-<version>-linux-x86_64.tar.gz                  bin/, the docs, SHA256SUMS
#   dist/ddprun-<version>-py3-none-manylinux_2_31_x86_64.whl   pip install: the programs on the environment's PATH
#   dist/ddprun_<version>_amd64.deb                            apt-get install ./ddprun_<version>_amd64.deb
#   dist/ddprun-<version>-image.tar                            an OCI archive (podman load): Debian 13, its
#                                                               python3-torch and ddprun; `torchrun` is ddprun
#
#   scripts/release.sh [all]     everything above (needs root: debootstrap, chroot, podman)
#   scripts/release.sh tarball   the portable build and the tarball alone (from a warm cache: about a minute)
#   scripts/release.sh build     the portable programs only (build-release/), with the ELF check
#   scripts/release.sh check-elf FILE...   the ELF check alone (below)
#   scripts/release.sh test      the install tests: ctest -L release in build-release/ (tests/release/)
#   scripts/release.sh roots     make (or check) every root and the image's base: a warm cache for `ci`
#   scripts/release.sh ci        what CI runs (scripts/test.sh): `all` then `test`, but only from a warm cache
#                                (see ci_decision); else one line saying what is cold and how to run it
#   scripts/release.sh decide    prints ci's decision ("run: WHY" or "skip: WHY") and does nothing else
#
# How: a Debian 11 (bullseye, glibc 2.31) root made with debootstrap from this machine's apt mirror (as the
# torch 2.6 root is: scripts/debian-root.sh) is the sysroot of the host's clang (packaging/portable-toolchain.cmake);
# the C++ dependencies Debian 11 lacks or has too old (fmt 9, spdlog 1.10, prometheus-cpp 1.0, CLI11, nlohmann-json
# 3.11: the versions the normal build uses on Debian 12) are built from Debian 12's source packages into the root's
# /usr/local, or unpacked there (header-only ones). DDPRUN_PORTABLE links libstdc++, libgcc and the dependencies
# statically (CMakeLists.txt). The ELF check then requires, of every program: NEEDED = glibc's own libraries
# only, and no symbol version above GLIBC_2.31 (readelf); the release stops otherwise.
#
# Everything made once is kept under $DDPRUN_RELEASE_CACHE (default /var/cache/ddprun/release), each with a stamp
# of what it was made from (a changed package list remakes it): the build root (~0.5 GB, ~2.5 min), its
# dependencies (~3 min of 2 cores), the install tests' roots (Debian 11 and 12 minbase with python3), the image's
# root (Debian 13 with python3-torch) and its base image in the release's own podman storage. The compiler cache
# is $DDPRUN_CCACHE_DIR (as root: /var/cache/ddprun/ccache). Builds run under nice -n 10.
#
# Environment: DDPRUN_RELEASE_CACHE, DDPRUN_RELEASE_DIST (default dist), DDPRUN_RELEASE_BUILD (default
# build-release), DDPRUN_BUILD_COMMIT (the commit to name when there is no .git), DDPRUN_DEBIAN_MIRROR
# (scripts/debian-root.sh).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/debian-root.sh
. "$repo/scripts/debian-root.sh"
DEBIAN_ROOT_WHO=release

cache=${DDPRUN_RELEASE_CACHE:-/var/cache/ddprun/release}
dist=${DDPRUN_RELEASE_DIST:-$repo/dist}
build=${DDPRUN_RELEASE_BUILD:-$repo/build-release}
[[ $dist == /* ]] || dist=$repo/$dist
[[ $build == /* ]] || build=$repo/$build
if [[ -z ${DDPRUN_CCACHE_DIR:-} && $(id -u) -eq 0 ]]; then
  export DDPRUN_CCACHE_DIR=/var/cache/ddprun/ccache
fi

# The roots. Each stamp names what the root was made from; tests/release/ finds the roots by these paths.
build_root=$cache/bullseye-build
build_root_packages=libstdc++-10-dev,libboost-dev,libboost-system-dev,libssl-dev,libmunge-dev
build_root_stamp="bullseye $build_root_packages relative-links"
test11_root=$cache/bullseye-test
test12_root=$cache/bookworm-test
test_root_packages=python3
test11_stamp="bullseye $test_root_packages"
test12_stamp="bookworm $test_root_packages"
image_root=$cache/trixie-image
image_root_packages=python3-torch,ca-certificates
image_root_stamp="trixie $image_root_packages"
# The sources of the dependencies (Debian 12, the normal build's distribution): built ones, header-only ones.
deps_suite=bookworm
deps_sources=(fmtlib spdlog prometheus-cpp)
deps_headers=(libcli11-dev nlohmann-json3-dev)
deps_stamp_text="deps-v1 ${deps_sources[*]} ${deps_headers[*]} $(cksum <"$repo/packaging/portable-toolchain.cmake")"
# What the portable programs are compiled from (not the docs, tests or scripts) and where a portable build records
# its digest: ci runs only for the sources last built (then the compiler cache holds every object).
build_sources=(CMakeLists.txt cmake agent launcher rendezvous worker_sdk packaging/portable-toolchain.cmake)
build_sources_stamp=$cache/portable-build.sources
# The glibc floor and the libraries of glibc a program may need.
glibc_floor=2.31
glibc_libraries="libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 ld-linux-x86-64.so.2"
# The release's own podman configuration and storage (runc: crun refuses hybrid cgroups; see podman_env).
podman_dir=$cache/podman

stamped() {
  # Whether FILE holds TEXT: what a root or the dependencies were made from.
  [[ -f $1 && $(cat "$1") == "$2" ]]
}

say() {
  echo "release: [$(date +%T)] $*" >&2
}

die() {
  echo "release: $*" >&2
  exit 1
}

need_root() {
  [[ $(id -u) -eq 0 ]] || die "$1 needs root (debootstrap, chroot, podman); run as root"
}

host_packages() {
  # Installs the Debian packages of the host that a step needs (apt-get; skipped when all are there).
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return
  need_root "installing ${missing[*]}"
  say "installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

private_apt() {
  # apt-get against one suite of the Debian mirror, with lists of its own under $cache/apt (the host's apt
  # sources and lists are not touched): private_apt SUITE deb|deb-src APT-GET-ARGS...
  local suite=$1 type=$2
  shift 2
  local dir=$cache/apt/$suite-$type
  mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
  echo "$type $(debian_mirror) $suite main" >"$dir/sources.list"
  local options=(-q -o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache" -o APT::Sandbox::User=root)
  if [[ ! -f $dir/updated || -n $(find "$dir/updated" -mmin +1440) ]]; then
    apt-get "${options[@]}" update >/dev/null
    touch "$dir/updated"
  fi
  apt-get "${options[@]}" "$@"
}

# ---- the build root and its dependencies ------------------------------------------------------------------
relative_links() {
  # The root as a sysroot: a link to an absolute path (/lib64/ld-linux-x86-64.so.2 -> /lib/x86_64-linux-gnu/...)
  # would lead the host's linker to the host's own files; each becomes the same link relative to where it is.
  local root=$1 link target
  while IFS= read -r -d '' link; do
    target=$(readlink "$link")
    [[ $target == /* ]] || continue
    ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$root$target")" "$link"
  done < <(find "$root/usr/lib" "$root/usr/lib64" "$root/usr/include" -type l -print0 2>/dev/null)
}

ensure_build_root() {
  DEBIAN_ROOT_HOOK=relative_links debian_root_ensure "$build_root" bullseye "$build_root_packages" \
    "$build_root_stamp"
  stamped "$build_root/usr/local/.ddprun-deps" "$deps_stamp_text" && return
  need_root "building the dependencies into $build_root"
  host_packages clang dpkg-dev cmake ninja-build
  say "building the dependencies into $build_root/usr/local (${deps_sources[*]} from Debian 12's sources; a few minutes)"
  local work=$cache/deps-work
  rm -rf "$work"
  mkdir -p "$work/src"
  (cd "$work/src" && private_apt "$deps_suite" deb-src source "${deps_sources[@]}" >"$work/source.log" 2>&1) ||
    die "apt-get source ${deps_sources[*]} ($deps_suite) failed: $(tail -n 3 "$work/source.log")"
  (cd "$work/src" && private_apt "$deps_suite" deb download "${deps_headers[@]}" >"$work/download.log" 2>&1) ||
    die "apt-get download ${deps_headers[*]} ($deps_suite) failed: $(tail -n 3 "$work/download.log")"
  local deb
  for deb in "$work"/src/*.deb; do
    dpkg-deb -x "$deb" "$build_root"
  done
  local common=(-G Ninja -DCMAKE_TOOLCHAIN_FILE="$repo/packaging/portable-toolchain.cmake" -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_INSTALL_PREFIX=/usr/local -DCMAKE_STAGING_PREFIX="$build_root/usr/local" -DBUILD_SHARED_LIBS=OFF
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON)
  export DDPRUN_PORTABLE_ROOT=$build_root
  build_dep() {
    local name=$1
    shift
    local src
    src=$(find "$work/src" -maxdepth 1 -type d -name "$name-*" | head -n 1)
    [[ -n $src ]] || die "no unpacked source of $name under $work/src"
    { cmake -S "$src" -B "$work/build-$name" "${common[@]}" "$@" &&
      nice -n 10 cmake --build "$work/build-$name" -j "$(nproc)" &&
      cmake --install "$work/build-$name"; } >"$work/$name.log" 2>&1 ||
      die "building $name failed (log: $work/$name.log): $(tail -n 5 "$work/$name.log")"
  }
  build_dep fmtlib -DFMT_DOC=OFF -DFMT_TEST=OFF
  build_dep spdlog -DSPDLOG_FMT_EXTERNAL=ON -DSPDLOG_BUILD_EXAMPLE=OFF -DSPDLOG_BUILD_TESTS=OFF
  build_dep prometheus-cpp -DENABLE_PULL=OFF -DENABLE_PUSH=OFF -DENABLE_COMPRESSION=OFF -DENABLE_TESTING=OFF \
    -DUSE_THIRDPARTY_LIBRARIES=OFF -DGENERATE_PKGCONFIG=OFF
  echo "$deps_stamp_text" >"$build_root/usr/local/.ddprun-deps"
  rm -rf "$work"
}

# ---- the portable build and the ELF check ---------------------------------------------------------------
version() {
  sed -n 's/^project(ddprun VERSION \([0-9.]*\).*/\1/p' "$repo/CMakeLists.txt"
}

build_commit() {
  if [[ -n ${DDPRUN_BUILD_COMMIT:-} ]]; then
    echo "$DDPRUN_BUILD_COMMIT"
  elif git -C "$repo" rev-parse --verify -q HEAD >/dev/null; then
    local commit
    commit=$(git -C "$repo" rev-parse HEAD)
    [[ -z $(git -C "$repo" status --porcelain --untracked-files=no) ]] || commit+=" with local changes"
    echo "$commit"
  else
    echo unknown
  fi
}

portable_build() {
  ensure_build_root
  host_packages clang cmake ninja-build ccache binutils
  export DDPRUN_PORTABLE_ROOT=$build_root
  say "portable build in $build (clang, sysroot $build_root)"
  mkdir -p "$build"
  local started=$SECONDS
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$repo/packaging/portable-toolchain.cmake" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDPRUN_PORTABLE=ON -DDDPRUN_BUILD_TESTS=OFF -DDDPRUN_RELEASE_TESTS=ON \
    -DDDPRUN_WITH_TORCH=OFF -DDDPRUN_WITH_CUDA=OFF -DDDPRUN_WITH_NCCL=OFF -DDDPRUN_TORCH26=OFF \
    >"$build/configure.log" 2>&1 || {
    cat "$build/configure.log" >&2
    die "configuring the portable build failed"
  }
  nice -n 10 cmake --build "$build" -j "$(nproc)" --target ddprun ddprun-store
  say "portable build: $((SECONDS - started)) s"
  check_elf "$build/launcher/ddprun" "$build/launcher/ddprun-store"
  local digest
  if digest=$(sources_digest); then
    echo "$digest $(git -C "$repo" rev-parse HEAD)" >"$build_sources_stamp"
  fi
}

sources_digest() {
  # A digest of build_sources as this checkout has them (the index and any uncommitted change); fails without git.
  git -C "$repo" rev-parse -q --verify HEAD >/dev/null 2>&1 || return 1
  { git -C "$repo" ls-files -s -- "${build_sources[@]}" && git -C "$repo" diff HEAD -- "${build_sources[@]}"; } |
    sha256sum | cut -d' ' -f1
}

check_elf() {
  # Every FILE needs glibc's own libraries only, and no symbol version above GLIBC_$glibc_floor.
  local file bad=0 lib needed versions newest
  for file in "$@"; do
    needed=$(readelf -d "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    for lib in $needed; do
      if [[ " $glibc_libraries " != *" $lib "* ]]; then
        echo "release: $file needs $lib, which is not part of glibc: link it statically (DDPRUN_PORTABLE) or load it with dlopen" >&2
        bad=1
      fi
    done
    versions=$(readelf -V "$file" | grep -o 'Name: [A-Z_]*[0-9.]*' | sed 's/Name: //' | sort -u)
    if grep -qv '^GLIBC_' <<<"$versions"; then
      echo "release: $file needs versioned symbols of a library other than glibc: $(grep -v '^GLIBC_' <<<"$versions" | tr '\n' ' ')" >&2
      bad=1
    fi
    newest=$(grep '^GLIBC_[0-9]' <<<"$versions" | sed 's/^GLIBC_//' | sort -V | tail -n 1)
    if [[ $(printf '%s\n' "$newest" "$glibc_floor" | sort -V | tail -n 1) != "$glibc_floor" ]]; then
      echo "release: $file needs GLIBC_$newest, above the floor GLIBC_$glibc_floor: $(readelf -W --dyn-syms "$file" | grep -o "[^ ]*@GLIBC_$newest" | sort -u | tr '\n' ' ')" >&2
      bad=1
    fi
    ((bad)) || say "ELF check: $(basename "$file"): NEEDED ${needed//$'\n'/ }, newest symbol version GLIBC_$newest (floor $glibc_floor)"
  done
  ((bad == 0)) || die "the ELF check failed: these programs would not start on every glibc >= $glibc_floor system"
}

# ---- the artifacts ------------------------------------------------------------------------------------------
stage_programs() {
  # $1/ddprun, ddprun-store (stripped) and ddprun-launch -> ddprun
  mkdir -p "$1"
  strip -o "$1/ddprun" "$build/launcher/ddprun"
  strip -o "$1/ddprun-store" "$build/launcher/ddprun-store"
  ln -sf ddprun "$1/ddprun-launch"
}

stage_docs() {
  mkdir -p "$1"
  cp "$repo/README.md" "$repo/LICENSE" "$1/"
  cp -r "$repo/docs" "$1/docs"
  cp "$repo/packaging/README.md" "$1/PACKAGING.md"
}

stage_shim() {
  # The libuv shim for Debian 13's python3-torch (docs/migrating-from-torchrun.md), not installed: README.md's
  # "Run your train.py" says how to put it in place.
  mkdir -p "$1"
  cp "$repo/scripts/torch26/ddprun_torch_no_libuv.py" "$1/"
}

make_tarball() {
  local v=$1 name="ddprun-$1-linux-x86_64"
  local stage=$work/$name
  mkdir -p "$stage"
  stage_programs "$stage/bin"
  stage_docs "$stage/share/doc/ddprun"
  stage_shim "$stage/share/ddprun"
  cp "$repo/LICENSE" "$stage/LICENSE"
  printf '%s\n' "ddprun $v" "commit $(build_commit)" >"$stage/VERSION"
  (cd "$stage" && find bin share VERSION LICENSE -type f -print0 | sort -z | xargs -0 sha256sum >SHA256SUMS)
  tar -C "$work" --owner=0 --group=0 --numeric-owner -czf "$dist/$name.tar.gz" "$name"
}

make_wheel() {
  local v=$1 stage=$work/wheel
  host_packages python3-build python3-wheel python3-setuptools
  cp -r "$repo/packaging/wheel" "$stage"
  # The workers' Python API (ddprun.state, ddprun.checkpoint: docs/state.md), importable wherever the wheel is
  # installed; in a job with --state_memory the agent's copy in the run directory comes first on PYTHONPATH.
  cp "$repo/agent/state/python/ddprun/state.py" "$repo/agent/state/python/ddprun/checkpoint.py" "$stage/ddprun/"
  mkdir -p "$stage/scripts"
  stage_programs "$stage/scripts"
  rm "$stage/scripts/ddprun-launch" # a wheel holds no links: ddprun-launch is an entry point (setup.py)
  cp "$repo/README.md" "$repo/LICENSE" "$stage/" # LICENSE: the wheel's .dist-info (license-files)
  printf 'VERSION = "%s"\nCOMMIT = "%s"\n' "$v" "$(build_commit)" >"$stage/ddprun/_build.py"
  (cd "$stage" && DDPRUN_WHEEL_VERSION=$v /usr/bin/python3 -m build --wheel --no-isolation --outdir "$dist" . \
    >"$work/wheel.log" 2>&1) || die "building the wheel failed (log: $work/wheel.log): $(tail -n 5 "$work/wheel.log")"
}

make_deb() {
  local v=$1 stage=$work/deb
  mkdir -p "$stage/DEBIAN" "$stage/usr/bin"
  stage_programs "$stage/usr/bin"
  stage_docs "$stage/usr/share/doc/ddprun"
  stage_shim "$stage/usr/share/ddprun"
  # Debian's copyright file (machine-readable format): packaging/debian/copyright, then LICENSE's full text as
  # the BSD-3-Clause stanza (blank lines as " .").
  { cat "$repo/packaging/debian/copyright"
    echo
    echo "License: BSD-3-Clause"
    sed -e 's/^$/./' -e 's/^/ /' "$repo/LICENSE"
  } >"$stage/usr/share/doc/ddprun/copyright"
  local size
  size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
  sed -e "s/@VERSION@/$v/" -e "s/@SIZE@/$size/" -e "s/@COMMIT@/$(build_commit)/" \
    "$repo/packaging/debian/control.in" >"$stage/DEBIAN/control"
  dpkg-deb --root-owner-group -Zxz --build "$stage" "$dist/ddprun_${v}_amd64.deb" >/dev/null
}

# ---- the image ---------------------------------------------------------------------------------------------
podman_env() {
  # The release's own containers.conf and storage: runc (crun refuses this machine's hybrid cgroups),
  # default_ulimits at the machine's own limits (podman's defaults may exceed them: then no container starts).
  mkdir -p "$podman_dir"
  local nofile nproc
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  [[ $nofile == unlimited ]] && nofile=1048576
  [[ $nproc == unlimited ]] && nproc=4194304
  # Podman's conmon runs with RLIMIT_NPROC at most the kernel's pid_max (32768 here, where the shell allows
  # 96365): a container asked for more fails in runc with "error setting rlimit type 6".
  local pid_max
  pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo "$nproc")
  ((nproc <= pid_max)) || nproc=$pid_max
  # podman build's RUN steps take no defaults from containers.conf: make_image passes the same limits.
  podman_ulimits=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
  cat >"$podman_dir/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
EOF
  cat >"$podman_dir/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$podman_dir/storage"
runroot = "$podman_dir/run"
EOF
  export CONTAINERS_CONF=$podman_dir/containers.conf CONTAINERS_STORAGE_CONF=$podman_dir/storage.conf
}

image_base_tag() {
  echo "localhost/ddprun-base:trixie-$(echo "$image_root_stamp" | cksum | cut -d' ' -f1)"
}

ensure_image_base() {
  host_packages podman buildah runc containernetworking-plugins
  podman_env
  local tag
  tag=$(image_base_tag)
  podman image exists "$tag" && return
  need_root "building the image's root"
  debian_root_ensure "$image_root" trixie "$image_root_packages" "$image_root_stamp"
  say "importing $image_root as $tag"
  # apt's downloaded packages and lists are not part of the image (as in Debian's own images).
  tar -C "$image_root" --exclude='./var/cache/apt/archives/*.deb' --exclude='./var/lib/apt/lists/*_*' \
    --exclude=./.ddprun-stamp -c . | podman import --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
}

make_image() {
  local v=$1 stage=$work/image
  ensure_image_base
  mkdir -p "$stage"
  stage_programs "$stage/bin"
  cp "$repo/scripts/torch26/ddprun_torch_no_libuv.py" "$stage/"
  local tag=localhost/ddprun:$v
  podman build --quiet "${podman_ulimits[@]}" --build-arg BASE="$(image_base_tag)" --build-arg VERSION="$v" \
    --build-arg COMMIT="$(build_commit)" -f "$repo/packaging/image/Containerfile" -t "$tag" "$stage" >/dev/null
  podman image prune -f >/dev/null # the previous build's image, untagged by this one
  rm -f "$dist/ddprun-$v-image.tar"
  podman save --quiet --format oci-archive -o "$dist/ddprun-$v-image.tar" "$tag"
}

release_all() {
  # release_all [tarball]: every artifact, or the tarball alone (the quick way to carry bin/ to another machine).
  local only=${1:-} started=$SECONDS v
  v=$(version)
  [[ -n $v ]] || die "no version in $repo/CMakeLists.txt (project(ddprun VERSION x.y.z))"
  [[ -f $repo/LICENSE ]] || die "no $repo/LICENSE: every artifact carries the license"
  need_root "the release"
  portable_build
  local built=$SECONDS
  mkdir -p "$dist"
  work=$(mktemp -d "$build/stage.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  local made=("ddprun-$v-linux-x86_64.tar.gz")
  say "tarball"
  make_tarball "$v"
  if [[ $only != tarball ]]; then
    say "wheel"
    make_wheel "$v"
    say ".deb"
    make_deb "$v"
    say "image"
    make_image "$v"
    made+=("ddprun-$v-py3-none-manylinux_2_31_x86_64.whl" "ddprun_${v}_amd64.deb" "ddprun-$v-image.tar")
  fi
  say "done: build $((built - started)) s, artifacts $((SECONDS - built)) s; ddprun $v (commit $(build_commit))"
  (cd "$dist" && ls -l "${made[@]}") >&2
}

# ---- the install tests and CI's decision ----------------------------------------------------------------------
ensure_test_roots() {
  need_root "the install tests' roots"
  debian_root_ensure "$test11_root" bullseye "$test_root_packages" "$test11_stamp"
  debian_root_ensure "$test12_root" bookworm "$test_root_packages" "$test12_stamp"
  "$repo/scripts/torch26-root.sh" >/dev/null
  # pip for the torch 2.6 root's Python 3.13 (the root has no pip): Debian 13's python3-pip-whl, unpacked.
  if ! compgen -G "$cache/pip/pip-*.whl" >/dev/null; then
    local tmp
    tmp=$(mktemp -d)
    (cd "$tmp" && private_apt trixie deb download python3-pip-whl >/dev/null) || die "apt-get download python3-pip-whl (trixie) failed"
    dpkg-deb -x "$tmp"/python3-pip-whl_*.deb "$tmp/x"
    mkdir -p "$cache/pip"
    cp "$tmp"/x/usr/share/python-wheels/pip-*.whl "$cache/pip/"
    rm -rf "$tmp"
  fi
  ensure_image_base
}

run_tests() {
  ensure_test_roots
  [[ -f $build/CTestTestfile.cmake ]] || die "no portable build in $build: run scripts/release.sh first"
  podman_env
  DDPRUN_RELEASE_DIST=$dist DDPRUN_RELEASE_CACHE=$cache \
    ctest --test-dir "$build" -L release --output-on-failure --timeout 900 "$@"
}

ci_decision() {
  # Prints "run: WHY" or "skip: WHY". CI starts on a fresh clone, maybe on a bare machine, and its budget has no
  # room for a cold release (~25-35 minutes of debootstrap, dependency builds and a cold portable build on 2 cores;
  # 13-18 minutes with warm roots when a merge changed most sources): the release tier runs in CI only from a warm
  # cache, whatever the change touches. Warm: run as root (debootstrap, chroot, podman), podman installed, every
  # root, the dependencies, Debian 13's pip wheel and the image's base image made under $cache with current stamps,
  # and the compiler cache warm for these sources (the last portable build here was of the same build_sources).
  # Then it costs a portable build of cache hits, the artifacts and the four tests (about 3-6 minutes).
  local cold=() digest built built_commit
  [[ $(id -u) -eq 0 ]] || cold+=("root (it runs as uid $(id -u))")
  if ! digest=$(sources_digest); then
    cold+=("the portable build's compiler cache (no git checkout to compare its sources)")
  elif [[ ! -f $build_sources_stamp ]]; then
    cold+=("the portable build's compiler cache (no portable build yet)")
  else
    read -r built built_commit <"$build_sources_stamp"
    [[ $built == "$digest" ]] ||
      cold+=("the portable build's compiler cache (the sources differ from the last portable build's, ${built_commit:0:12})")
  fi
  stamped "$build_root/.ddprun-stamp" "$build_root_stamp" || cold+=("the build root")
  stamped "$build_root/usr/local/.ddprun-deps" "$deps_stamp_text" || cold+=("its dependencies")
  stamped "$test11_root/.ddprun-stamp" "$test11_stamp" || cold+=("the Debian 11 test root")
  stamped "$test12_root/.ddprun-stamp" "$test12_stamp" || cold+=("the Debian 12 test root")
  compgen -G "$cache/pip/pip-*.whl" >/dev/null || cold+=("pip for Debian 13")
  if ! command -v podman >/dev/null; then
    cold+=("podman")
  elif [[ ! -f $podman_dir/storage.conf ]] || ! (podman_env && podman image exists "$(image_base_tag)" 2>/dev/null); then
    cold+=("the image's base")
  fi
  if ((${#cold[@]} == 0)); then
    echo "run: the release cache is warm ($cache)"
  else
    local missing
    missing=$(printf '%s, ' "${cold[@]}")
    echo "skip: the release cache is cold (missing: ${missing%, }); run the release tier with" \
      "'scripts/release.sh all && scripts/release.sh test' as root (~30 min cold; it warms $cache for CI)"
  fi
}

case ${1:-all} in
  all) release_all ;;
  tarball) release_all tarball ;;
  build) portable_build ;;
  roots)
    ensure_build_root
    ensure_test_roots
    say "the release cache is warm: $cache"
    ;;
  check-elf)
    shift
    (($# > 0)) || die "usage: release.sh check-elf FILE..."
    check_elf "$@"
    ;;
  test)
    shift
    run_tests "$@"
    ;;
  decide) ci_decision ;;
  ci)
    decision=$(ci_decision)
    say "release tier: $decision"
    if [[ $decision == run:* ]]; then
      release_all
      run_tests
    fi
    ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) die "unknown command '$1' (all, tarball, build, check-elf, test, roots, ci, decide; --help)" ;;
esac
