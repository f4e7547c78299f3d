# shellcheck shell=bash disable=SC2154  # $repo, $build and log() come from the sourcing script
# What the benchmark scripts (scripts/bench-*.sh) share. Sourced after they set $repo (the checkout) and
# define log(); bench_build also needs $build. Sourcing it sets the EXIT, INT and TERM traps: INT and TERM exit
# with 130, and on any exit the hooks registered with at_exit run, the last registered first.

# ---- exit hooks ----------------------------------------------------------------------------------------------
bench_exit_hooks=()
# at_exit FUNCTION: runs FUNCTION when the script exits, however it exits.
at_exit() { bench_exit_hooks+=("$1"); }
bench_run_exit_hooks() {
  local i
  for ((i = ${#bench_exit_hooks[@]} - 1; i >= 0; i--)); do "${bench_exit_hooks[i]}"; done
}
trap bench_run_exit_hooks EXIT
trap 'exit 130' INT TERM

# stop_process PID: SIGTERM to PID, then reaps it (nothing when it is gone already).
stop_process() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# ---- build -----------------------------------------------------------------------------------------------
# bench_build PROGRAM...: each PROGRAM is a path under $build whose name is its CMake target
# ($build/launcher/ddprun). With BENCH_BUILD=0, only checks that they exist (e.g. the shared RelWithDebInfo
# build, used as it is); otherwise configures $build as Release with the benchmark programs on
# (-DDDPRUN_BUILD_BENCHMARKS=ON) and -Werror off (GCC 12 at -O3 can report false -Wmaybe-uninitialized
# warnings; the test builds keep -Werror on) and builds those targets, in a process group of its own waited
# for with `wait`, so that INT/TERM stop the build at once. Exits 1 when a program is missing or the build
# fails (its log, $build/<script>-build.log, is printed then).
bench_build() {
  local program targets=() names
  if [[ ${BENCH_BUILD:-1} == 0 ]]; then
    log "using $build as built (BENCH_BUILD=0)"
    for program in "$@"; do bench_require "$program"; done
    return 0
  fi
  for program in "$@"; do targets+=("$(basename "$program")"); done
  names=$(printf '%s\n' "${targets[@]}" | paste -sd' ' - | sed 's/ \([^ ]*\)$/ and \1/')
  log "building $names in $build (Release)"
  mkdir -p "$build"
  local build_log
  build_log=$build/$(basename "$0" .sh)-build.log
  # shellcheck disable=SC2016  # $1, $2 and $@ belong to the inner shell
  setsid bash -c 'cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDPRUN_BUILD_BENCHMARKS=ON \
      -DDDPRUN_WERROR=OFF &&
    ninja -C "$2" -j2 "${@:3}"' build "$repo" "$build" "${targets[@]}" >"$build_log" 2>&1 &
  local build_pid=$!
  trap 'kill -- -$build_pid 2>/dev/null; exit 130' INT TERM
  if ! wait "$build_pid"; then
    cat "$build_log" >&2
    log "build failed"
    exit 1
  fi
  trap 'exit 130' INT TERM
}

# bench_require PROGRAM: exits 1 unless PROGRAM is executable; a missing benchmark program (one under
# $build/scripts/bench) comes with how to get it: configure $build with -DDDPRUN_BUILD_BENCHMARKS=ON.
bench_require() {
  [[ -x $1 ]] && return 0
  if [[ $1 == "$build"/scripts/bench/* ]]; then
    log "missing $1: the benchmark programs are built only when $build is configured with" \
      "-DDDPRUN_BUILD_BENCHMARKS=ON"
  else
    log "missing $1"
  fi
  exit 1
}

# ---- processes marked with a token ---------------------------------------------------------------------------
# Every process that run_marked starts carries BENCH_LAUNCHER_TOKEN=$bench_token in its environment, and so do
# their descendants (a launcher, its workers); on any exit, the helper still running is stopped and whatever
# still holds the token is killed. Only our own processes can carry this token.
bench_token="$$-$(date +%s%N)"
bench_helper_pid=""

# run_marked COMMAND...: runs COMMAND with the token (under `nice -n BENCH_NICE` when BENCH_NICE is set) and
# waits for it; its exit status is run_marked's.
run_marked() {
  local nice_cmd=()
  [[ -n ${BENCH_NICE:-} ]] && nice_cmd=(nice -n "$BENCH_NICE")
  BENCH_LAUNCHER_TOKEN=$bench_token "${nice_cmd[@]}" "$@" &
  bench_helper_pid=$!
  wait "$bench_helper_pid"
  bench_helper_pid=""
}

bench_kill_marked() {
  [[ -n $bench_helper_pid ]] && stop_process "$bench_helper_pid"
  local env pid
  # shellcheck disable=SC2013  # one /proc/<pid>/environ path per word
  for env in $(grep -lzxF "BENCH_LAUNCHER_TOKEN=$bench_token" /proc/[0-9]*/environ 2>/dev/null); do
    pid=${env#/proc/}
    pid=${pid%/environ}
    [[ $pid == "$$" ]] && continue
    log "killing leftover process $pid"
    kill -KILL "$pid" 2>/dev/null || true
  done
}
at_exit bench_kill_marked

# ---- torch 2.6 configurations ------------------------------------------------------------------------------
# torch26_configs LIST: LIST is comma-separated configuration names. When the torch 2.6 root of
# scripts/torch26-root.sh is built, prints LIST unchanged and returns 0; otherwise says so through log(),
# prints LIST without the names that contain "2.6", and returns 1.
torch26_configs() {
  if "$repo/scripts/torch26-root.sh" path >/dev/null 2>&1; then
    echo "$1"
    return 0
  fi
  log "no torch 2.6 root (scripts/torch26-root.sh builds it): the torch 2.6 configurations are left out"
  tr ',' '\n' <<<"$1" | grep -v -- '2\.6' | paste -sd, -
  return 1
}

# with_torch26 LIST: sets $configs to torch26_configs LIST, and the array torch26_args to the benchmark
# helpers' "--torch26-root R --torch26-python P" when the root is built (else empty).
# shellcheck disable=SC2034  # configs and torch26_args are the sourcing script's
with_torch26() {
  torch26_args=()
  if configs=$(torch26_configs "$1"); then
    torch26_args=(--torch26-root "$repo/scripts/torch26-root.sh" --torch26-python "$repo/scripts/torch26-python")
  fi
}
