#!/usr/bin/env bash
# Launcher benchmark: ddprun against torchrun (torch 1.13's torch.distributed.run), in one run, with the same
# worker program (tests/bin/fake_worker via --no_python) for both.
#
#   scripts/bench-launcher.sh [BUILD_DIR]      (default BUILD_DIR: <repo>/build-bench-launcher, Release)
#
# Builds ddprun and fake_worker, then scripts/bench/launcher_bench.py measures, for ddprun, torchrun with its
# defaults (--monitor_interval 5 in 1.13) and torchrun --monitor_interval 0.1:
#   launch-to-exit of --standalone --nproc_per_node 8 no-op workers; restart latency from a worker crash to
#   the replacements running (--max_restarts 1); the agent's peak RSS. See launcher_bench.py for the method.
# Prints a Markdown table on stdout (progress on stderr); the raw results go to BUILD_DIR/bench-launcher.json.
# Takes about 3-4 minutes after the build, mostly torchrun. No torchrun run is started that would likely end
# later than BENCH_DEADLINE_S (default 420) seconds after the script started (build included), so the whole
# script ends within about 7.5 minutes; the table counts the runs skipped for this.
#
# Environment: BENCH_NPROC (8), BENCH_REPS_DDPRUN (20), BENCH_REPS_TORCH (5), BENCH_RESTART_REPS_DDPRUN (20),
# BENCH_RESTART_REPS_TORCH (4), BENCH_DEADLINE_S (420), BENCH_LAUNCHERS (ddprun,torchrun,torchrun-0.1),
# TORCH_PYTHON (a Python with torch, default /usr/bin/python3), BENCH_NICE (run the measurement under
# `nice -n BENCH_NICE`, e.g. -10 as root on a machine shared with builds; unset: as started).
# torchrun always gets --redirects 1 --tee 1 (Debian's torch 1.13.1 on Python 3.11 crashes with the default
# 0/0); ddprun gets the same flags.
# Needs /usr/bin/time (Debian package `time`; installed with apt-get when missing and running as root).
# Exit codes: 0 done (failed runs show in the table), 1 build failed, no torch or no /usr/bin/time.
set -euo pipefail
start=$(date +%s)

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(realpath -m "${1:-$repo/build-bench-launcher}")
python=${TORCH_PYTHON:-/usr/bin/python3}

log() { echo "bench-launcher: $*" >&2; }

# ---- build ---------------------------------------------------------------------------------------------
# fake_worker lives with the tests, so tests stay on (only the two targets are built). -Werror is off here:
# GCC 12 at -O3 can report false -Wmaybe-uninitialized warnings (seen in agent/elastic_agent.cc); the test
# builds keep -Werror on.
log "building ddprun and fake_worker in $build (Release)"
mkdir -p "$build"
# In its own process group (setsid), waited for with `wait`, so that INT/TERM stop the build at once.
setsid bash -c 'cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDPRUN_WERROR=OFF &&
  ninja -C "$2" -j2 ddprun fake_worker' build "$repo" "$build" >"$build/bench-launcher-build.log" 2>&1 &
build_pid=$!
trap 'kill -- -$build_pid 2>/dev/null; exit 130' INT TERM
if ! wait "$build_pid"; then
  cat "$build/bench-launcher-build.log" >&2
  log "build failed"
  exit 1
fi
trap - INT TERM
if [[ ! -x /usr/bin/time ]] && [[ $(id -u) == 0 ]]; then
  log "installing the package 'time' for /usr/bin/time"
  apt-get install -y -qq time >&2 || true
fi
if [[ ! -x /usr/bin/time ]]; then
  log "/usr/bin/time is missing: apt-get install time"
  exit 1
fi
if ! "$python" -c 'import torch.distributed.run' 2>/dev/null; then
  log "$python cannot import torch.distributed.run (set TORCH_PYTHON)"
  exit 1
fi

# ---- measure -------------------------------------------------------------------------------------------
# Every process of the benchmark carries BENCH_LAUNCHER_TOKEN in its environment; on any exit, whatever still
# holds it (the helper, a launcher, a worker) is killed. Only our own processes can carry this token.
token="$$-$(date +%s%N)"
helper_pid=""
cleanup() {
  if [[ -n $helper_pid ]]; then
    kill "$helper_pid" 2>/dev/null || true
    wait "$helper_pid" 2>/dev/null || true
  fi
  local env pid
  for env in $(grep -lzxF "BENCH_LAUNCHER_TOKEN=$token" /proc/[0-9]*/environ 2>/dev/null); do
    pid=${env#/proc/}
    pid=${pid%/environ}
    [[ $pid == "$$" ]] && continue
    log "killing leftover process $pid"
    kill -KILL "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

nice_cmd=()
[[ -n ${BENCH_NICE:-} ]] && nice_cmd=(nice -n "$BENCH_NICE")
BENCH_LAUNCHER_TOKEN=$token "${nice_cmd[@]}" "$python" "$repo/scripts/bench/launcher_bench.py" \
  --ddprun "$build/launcher/ddprun" --worker "$build/tests/bin/fake_worker" --python "$python" \
  --nproc "${BENCH_NPROC:-8}" --reps-ddprun "${BENCH_REPS_DDPRUN:-20}" --reps-torch "${BENCH_REPS_TORCH:-5}" \
  --restart-reps-ddprun "${BENCH_RESTART_REPS_DDPRUN:-20}" \
  --restart-reps-torch "${BENCH_RESTART_REPS_TORCH:-4}" \
  --stop-at "$((start + ${BENCH_DEADLINE_S:-420}))" \
  --launchers "${BENCH_LAUNCHERS:-ddprun,torchrun,torchrun-0.1}" \
  --token "$token" --json "$build/bench-launcher.json" &
helper_pid=$!
wait "$helper_pid"
helper_pid=""
log "raw results: $build/bench-launcher.json"
