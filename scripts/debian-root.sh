# Debian roots made with debootstrap from this machine's apt mirror, and commands run inside them. Sourced by
# scripts/torch26-root.sh (the torch 2.6 root of the tests) and scripts/release.sh (the release's build root,
# the roots its install tests run in, the image's root); not run on its own.
#
#   debian_mirror                              print the mirror to debootstrap from (see below)
#   debian_root_ensure ROOT SUITE PKGS STAMP   make ROOT (debootstrap --variant=minbase SUITE, with the comma-
#                                              separated PKGS) unless ROOT/.ddprun-stamp holds STAMP; PKGS may be
#                                              empty; DEBIAN_ROOT_HOOK, when set, names a function called with
#                                              the new root's path before it is moved into place
#   debian_root_run ROOT DIR... -- CMD ARGS... run CMD inside ROOT (below); the exit code is CMD's
#
# Building a root needs root (debootstrap, chroot). A root is built under ROOT.tmp and renamed when complete,
# so an interrupted build leaves no half root behind; a stamp that differs (another package list) rebuilds it.
#
# debian_root_run keeps the caller's PID, environment, network namespace and working directory: it enters a
# private mount namespace (unshare --mount), bind-mounts /proc, /sys, /dev, /run and each DIR onto the same
# path in the root (a DIR that does not exist is skipped), /etc/hosts and /etc/resolv.conf onto the root's,
# and execs CMD there. With DEBIAN_ROOT_OVERLAY=DIR the root is seen through an overlay whose changes go to DIR
# (an install test's apt-get or dpkg -i leaves the root as it was; remove DIR afterwards).
# shellcheck shell=bash

debian_root_die() {
  echo "${DEBIAN_ROOT_WHO:-debian-root}: $*" >&2
  exit 1
}

debian_mirror() {
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
  ((${#files[@]} > 0)) || debian_root_die "no apt sources on this machine (/etc/apt/sources.list, /etc/apt/sources.list.d/): cannot tell which Debian mirror to build a root from; name one with DDPRUN_DEBIAN_MIRROR=URL"
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
  [[ -n $found ]] || debian_root_die "no Debian release mirror in this machine's apt sources (${files[*]}): cannot tell where to debootstrap a root from; add one there, or name one with DDPRUN_DEBIAN_MIRROR=URL"
  echo "$found"
}

debian_root_ensure() {
  local root=$1 suite=$2 packages=$3 stamp=$4
  if [[ -f $root/.ddprun-stamp && $(cat "$root/.ddprun-stamp") == "$stamp" ]]; then
    return 0
  fi
  [[ $(id -u) -eq 0 ]] || debian_root_die "building $root needs root (debootstrap); run as root"
  command -v debootstrap >/dev/null || {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q --no-install-recommends debootstrap
  }
  local tmp=$root.tmp from include=()
  rm -rf "$tmp"
  mkdir -p "$(dirname "$root")"
  from=$(debian_mirror)
  [[ -n $packages ]] && include=(--include="$packages")
  echo "${DEBIAN_ROOT_WHO:-debian-root}: building $root (debootstrap $suite from $from, this machine's apt mirror; a few minutes)" >&2
  if ! debootstrap --variant=minbase "${include[@]}" "$suite" "$tmp" "$from" >"$tmp.log" 2>&1; then
    tail -n 20 "$tmp.log" >&2
    debian_root_die "debootstrap of $suite failed (log: $tmp.log)"
  fi
  if [[ -n ${DEBIAN_ROOT_HOOK:-} ]]; then
    "$DEBIAN_ROOT_HOOK" "$tmp"
  fi
  echo "$stamp" >"$tmp/.ddprun-stamp"
  rm -rf "$root"
  mv "$tmp" "$root"
  rm -f "$tmp.log"
}

debian_root_run() {
  local root=$1
  shift
  [[ -f $root/.ddprun-stamp ]] || debian_root_die "no root at $root (not built)"
  local binds=(/proc /sys /dev /run)
  while (($# > 0)) && [[ $1 != -- ]]; do
    binds+=("$1")
    shift
  done
  (($# > 1)) || debian_root_die "usage: debian_root_run ROOT DIR... -- CMD [ARGS...]"
  shift
  # chroot lives in /usr/sbin, which the caller's PATH may leave out.
  local chroot
  chroot=$(PATH=$PATH:/usr/sbin:/sbin command -v chroot) || debian_root_die "no chroot program (coreutils)"
  # Inside a fresh mount namespace: bind the host paths, then chroot, cd and exec (PID unchanged).
  exec unshare --mount --propagation private -- /bin/sh -c '
    root=$1; cwd=$2; overlay=$3; chroot=$4; shift 4
    if [ -n "$overlay" ]; then
      mkdir -p "$overlay/upper" "$overlay/work" "$overlay/merged" || exit 125
      mount -t overlay overlay -o "lowerdir=$root,upperdir=$overlay/upper,workdir=$overlay/work" \
        "$overlay/merged" || exit 125
      root=$overlay/merged
    fi
    while [ "$1" != "--" ]; do
      if [ -d "$1" ]; then
        mkdir -p "$root$1" && mount --rbind "$1" "$root$1" || exit 125
      fi
      shift
    done
    shift
    # A minbase root may have no /etc/hosts (Debian 11 and 12): an empty one to bind the host'\''s onto.
    for f in /etc/hosts /etc/resolv.conf; do
      [ -e "$root$f" ] || : >"$root$f" 2>/dev/null
      mount --bind "$f" "$root$f" 2>/dev/null || true
    done
    exec "$chroot" "$root" /bin/sh -c '\''cd "$1" || exit 125; shift; exec "$@"'\'' sh "$cwd" "$@"
  ' sh "$root" "$PWD" "${DEBIAN_ROOT_OVERLAY:-}" "$chroot" "${binds[@]}" -- "$@"
}
