#!/usr/bin/env bash
# ddprun on a host without libmunge (issue 43): it loads libmunge at run time (rendezvous/auth/munge_library.h),
# so it starts and runs a job without it, and --rdzv_auth munge ends with exit 2 naming libmunge. The host is
# played by a mount namespace of this test's own in which libmunge.so.2 is /dev/null (needs root: exit 77,
# skipped, without). Before, the dynamic linker refused to start ddprun at all.
#
#   without_libmunge_test.sh DDPRUN
set -euo pipefail
ddprun=$1
if [[ $EUID -ne 0 ]] || ! command -v unshare >/dev/null; then
  echo "skipped: hiding libmunge takes a mount namespace (root, unshare)"
  exit 77
fi
lib=$(/sbin/ldconfig -p | awk '/libmunge\.so\.2 / && !found++ {print $NF}')  # no early exit: pipefail
hide=""
[[ -n $lib ]] && hide="mount --bind /dev/null $(readlink -f "$lib") &&"
out=$(mktemp -d /tmp/ddprun-nomunge-XXXXXX)
trap 'rm -rf "$out"' EXIT
unshare -m --propagation private bash -c "$hide
  '$ddprun' --help >'$out/help' 2>&1; echo \$? >'$out/help.rc'
  '$ddprun' --standalone --nproc_per_node 1 --no_python /bin/true >'$out/job' 2>&1; echo \$? >'$out/job.rc'
  SLURM_JOB_ID=4242 '$ddprun' --rdzv_auth munge --standalone --nproc_per_node 1 --no_python /bin/true \
    >'$out/munge' 2>&1; echo \$? >'$out/munge.rc'"
fail=0
check() {  # check NAME WANTED_RC [TEXT]
  local rc
  rc=$(cat "$out/$1.rc")
  if [[ $rc != "$2" ]] || { [[ -n ${3:-} ]] && ! grep -qF -- "$3" "$out/$1"; }; then
    echo "FAIL: $1: exit $rc (wanted $2${3:+, with '$3'}):"
    cat "$out/$1"
    fail=1
  fi
}
check help 0
check job 0
check munge 2 "libmunge cannot be loaded"
[[ $fail -eq 0 ]] && echo "ddprun runs without libmunge; --rdzv_auth munge names it"
exit $fail
