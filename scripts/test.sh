#!/usr/bin/env bash
# Builds ddprun and runs its tests. Two tiers (docs/testing.md says what each holds and what it costs):
#
#   scripts/test.sh                 the README's test command and CI's (.ci/run): installs what it needs
#                                   (Slurm too), builds the torch 2.6 root, builds, runs every suite this
#                                   machine can run (unit, integration, interop, netns, Slurm, torch 2.6, the
#                                   SDK in the torch 2.6 root), a bounded libFuzzer run, and the release tier
#                                   (scripts/release.sh ci: the portable build, the four artifacts and their
#                                   install tests, only from a warm release cache; else one line says what is
#                                   cold and how to run it; packaging/README.md)
#   scripts/test.sh --quick         the everyday tier, after every change: unit tests and the integration tests
#                                   that need no network namespaces, Slurm, torch 2.6 root or long torch jobs
#                                   (ctest -LE 'netns|slurm|torch26|slow|fuzz'); a couple of minutes warm
#
# Options (either tier):
#   --repeat N          run every selected test N times in a row, stopping at its first failure (a hunt
#                       for flaky tests: ctest --repeat until-fail:N)
#   --jobs N            tests at once (default: DDPRUN_TEST_JOBS, else 2 x the cores: most integration time is
#                       waiting; CPU-heavy tests declare their share with the PROCESSORS property)
#   -- ARGS...          further ctest arguments, e.g. -- -R test_signals_orphans  (CTEST_ARGS works too)
# Environment: DDPRUN_BUILD_DIR (default build), DDPRUN_SKIP_FUZZ=1 (no fuzz run), DDPRUN_SKIP_RELEASE=1 (no
# release tier), DDPRUN_CCACHE_DIR (default
# /var/cache/ddprun/ccache as root, else ccache's own: the compiler cache lives outside the clone, so the
# next clone's build on this machine is mostly cache hits).
# The full tier makes every suite run: the torch 2.6 root is built (or reused) here, Slurm is installed, and
# DDPRUN_REQUIRE_ALL_SUITES=1 turns a suite's would-be skip into a failure. Only what the machine cannot do (a
# GPU) skips, visibly. Exit status: 0 when everything passed, else non-zero (the failing step's).
set -euo pipefail
cd "$(dirname "$0")/.."

tier=full
repeat=1
jobs=${DDPRUN_TEST_JOBS:-$((2 * $(nproc)))}
extra=()
while (($# > 0)); do
  case $1 in
    --quick) tier=quick ;;
    --full) tier=full ;;
    --repeat)
      repeat=${2:?--repeat needs a count}
      shift
      ;;
    --repeat=*) repeat=${1#*=} ;;
    --jobs)
      jobs=${2:?--jobs needs a count}
      shift
      ;;
    --jobs=*) jobs=${1#*=} ;;
    --)
      shift
      extra=("$@")
      break
      ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "test.sh: unknown option '$1' (--quick, --repeat N, --jobs N, -- CTEST_ARGS; --help)" >&2
      exit 2
      ;;
  esac
  shift
done
[[ $repeat =~ ^[1-9][0-9]*$ ]] || {
  echo "test.sh: --repeat wants a positive count, not '$repeat'" >&2
  exit 2
}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || {
  echo "test.sh: --jobs wants a positive count, not '$jobs'" >&2
  exit 2
}

# Each phase's start, and at the end how long each took (the figures docs/testing.md records).
phases=()
phase_name="" phase_started=$SECONDS
phase() {
  [[ -n $phase_name ]] && phases+=("$phase_name: $((SECONDS - phase_started)) s")
  phase_name=$1 phase_started=$SECONDS
  echo "test.sh: [$(date +%T)] $*"
}
started=$SECONDS

build=${DDPRUN_BUILD_DIR:-build}
if [[ $tier == full ]]; then
  phase "dependencies"
  DDPRUN_DEPS_SLURM=1 scripts/install-deps.sh
  phase "torch 2.6 root"
  scripts/torch26-root.sh
  export DDPRUN_REQUIRE_ALL_SUITES=${DDPRUN_REQUIRE_ALL_SUITES:-1}
  torch26=ON
else
  scripts/install-deps.sh
  torch26=AUTO # the quick tier runs nothing of the root, so it need not exist
fi

# ccache (scripts/install-deps.sh installs it) keyed on paths relative to the build directory, so a fresh
# clone on this machine hits what the last one compiled. Every build below reads the directory from the
# environment (CMakeLists.txt): the host's, the torch 2.6 root's (bound into the root) and the fuzz build.
if [[ -z ${DDPRUN_CCACHE_DIR:-} && $(id -u) -eq 0 ]]; then
  export DDPRUN_CCACHE_DIR=/var/cache/ddprun/ccache
fi

phase "configure and build ($build)"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
mkdir -p "$build"
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDPRUN_TORCH26=$torch26 \
  >"$build/configure-output.log" 2>&1 || {
  cat "$build/configure-output.log" >&2
  exit 1
}
grep '^-- ddprun' "$build/configure-output.log" || true
cmake --build "$build" -j "$(nproc)"

if [[ $tier == full ]]; then
  # The SDK's build inside the torch 2.6 root is CPU-bound for minutes: done here, before the tests, where it
  # starves nothing; the ctest case sdk.libtorch26 then finds it built and runs the SDK's tests there.
  phase "the worker SDK's build in the torch 2.6 root"
  scripts/check-sdk-torch26.sh --build-only
fi

selection=()
if [[ $tier == quick ]]; then
  selection=(-LE 'netns|slurm|torch26|slow|fuzz')
fi
repeat_args=()
((repeat > 1)) && repeat_args=(--repeat "until-fail:$repeat")
phase "ctest ${selection[*]} -j $jobs ${repeat_args[*]} ${extra[*]} ${CTEST_ARGS:-}"
# shellcheck disable=SC2086
ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900 "${selection[@]}" "${repeat_args[@]}" \
  "${extra[@]}" ${CTEST_ARGS:-}

if [[ $tier == full && ${DDPRUN_SKIP_FUZZ:-0} != 1 ]]; then
  phase "fuzz smoke"
  scripts/fuzz.sh
fi

if [[ $tier == full && ${DDPRUN_SKIP_RELEASE:-0} != 1 ]]; then
  phase "release tier (scripts/release.sh ci decides whether it runs)"
  scripts/release.sh ci
fi
phase "done in $((SECONDS - started)) s"
printf 'test.sh: %s\n' "${phases[@]}"
