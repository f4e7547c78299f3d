#!/usr/bin/env bash
# Launcher benchmark: ddprun against torchrun of torch 1.13 (this machine's torch.distributed.run) and of
# torch 2.6 (/usr/bin/torchrun in the Debian 13 root of scripts/torch26-root.sh), in one run, with the same
# worker program (tests/bin/fake_worker via --no_python) for all.
#
#   scripts/bench-launcher.sh [BUILD_DIR]      (default BUILD_DIR: <repo>/build-bench-launcher, Release)
#
# Builds ddprun and fake_worker, then scripts/bench/launcher_bench.py measures, for ddprun, torchrun 1.13 with
# its defaults (--monitor_interval 5), torchrun 1.13 --monitor_interval 0.1 and torchrun 2.6 (its defaults:
# --monitor_interval 0.1; started as `scripts/torch26-root.sh run /usr/bin/torchrun`):
#   launch-to-exit of --standalone --nproc_per_node 8 no-op workers; restart latency from a worker crash to
#   the replacements running (--max_restarts 1); the agent's peak RSS. See launcher_bench.py for the method.
# The torch 2.6 root's wrapper (unshare, bind mounts, chroot) is timed alone in the same run
# (`torch26-root.sh run /bin/true`) and the table has a launch row with its median subtracted.
# Prints a Markdown table on stdout (progress on stderr), with the load average (/proc/loadavg, as `uptime`
# shows it) before and after; the raw results go to BENCH_RESULTS_DIR/bench-launcher.json (default
# BUILD_DIR). Takes about 4-5 minutes after the build on a quiet machine, mostly torchrun. No torchrun run is
# started that would likely end later than BENCH_DEADLINE_S (default 600) seconds after the script started
# (build included), so the whole script ends within about 11 minutes; the table counts the runs skipped.
#
# Then scripts/bench/spawn_curve.py: ddprun's launch-to-exit of 1, 8, 32 and 128 no-op workers against the
# floor (the same workers started with posix_spawn and waited for, no agent): the agent's cost per worker.
# Environment: BENCH_CURVE (1; 0 leaves the curve out), BENCH_CURVE_SIZES (1,8,32,128), BENCH_CURVE_REPS (15),
# BENCH_NPROC (8), BENCH_REPS_DDPRUN (20), BENCH_REPS_TORCH (7), BENCH_RESTART_REPS_DDPRUN (20),
# BENCH_RESTART_REPS_TORCH (5), BENCH_WRAPPER_REPS (10), BENCH_DEADLINE_S (600),
# BENCH_LAUNCHERS (ddprun,torchrun,torchrun-0.1,torchrun-2.6; torchrun-2.6 is left out when the root is not
# built), TORCH_PYTHON (a Python with torch 1.13, default /usr/bin/python3), BENCH_NICE (run the measurement
# under `nice -n BENCH_NICE`, e.g. -10 as root on a machine shared with builds; unset: as started),
# BENCH_BUILD (1: configure and build BUILD_DIR as Release; 0: use BUILD_DIR as it is, e.g. the shared
# RelWithDebInfo build, without touching it).
# torchrun always gets --redirects 1 --tee 1 (Debian's torch 1.13.1 on Python 3.11 crashes with the default
# 0/0); ddprun and torchrun 2.6 get the same flags.
# Needs /usr/bin/time (Debian package `time`; installed with apt-get when missing and running as root).
# Exit codes: 0 done (failed runs show in the table), 1 build failed, no torch or no /usr/bin/time.
set -euo pipefail
start=$(date +%s)

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(realpath -m "${1:-$repo/build-bench-launcher}")
python=${TORCH_PYTHON:-/usr/bin/python3}

log() { echo "bench-launcher: $*" >&2; }
source "$repo/scripts/bench/common.sh"

# ---- build ---------------------------------------------------------------------------------------------
# fake_worker lives with the tests, so tests stay on (only the two targets are built).
bench_build "$build/launcher/ddprun" "$build/tests/bin/fake_worker"
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
launchers=${BENCH_LAUNCHERS:-ddprun,torchrun,torchrun-0.1,torchrun-2.6}
torch26_args=()
if launchers=$(torch26_configs "$launchers"); then
  torch26_args=(--torch26-root "$repo/scripts/torch26-root.sh")
fi
results_dir=${BENCH_RESULTS_DIR:-$build}
mkdir -p "$results_dir"
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
# The helpers and everything they start carry the token of scripts/bench/common.sh: killed on any exit.
run_marked "$python" "$repo/scripts/bench/launcher_bench.py" \
  --ddprun "$build/launcher/ddprun" --worker "$build/tests/bin/fake_worker" --python "$python" \
  "${torch26_args[@]}" --build-type "${build_type:-?}" --wrapper-reps "${BENCH_WRAPPER_REPS:-10}" \
  --nproc "${BENCH_NPROC:-8}" --reps-ddprun "${BENCH_REPS_DDPRUN:-20}" --reps-torch "${BENCH_REPS_TORCH:-7}" \
  --restart-reps-ddprun "${BENCH_RESTART_REPS_DDPRUN:-20}" \
  --restart-reps-torch "${BENCH_RESTART_REPS_TORCH:-5}" \
  --stop-at "$((start + ${BENCH_DEADLINE_S:-600}))" \
  --launchers "$launchers" \
  --token "$bench_token" --json "$results_dir/bench-launcher.json"
log "raw results: $results_dir/bench-launcher.json"

# ---- agent cost per worker: ddprun against the kernel's cost of the same processes -----------------------
if [[ ${BENCH_CURVE:-1} == 1 ]]; then
  echo
  run_marked "$python" "$repo/scripts/bench/spawn_curve.py" \
    --ddprun "$build/launcher/ddprun" --worker "$build/tests/bin/fake_worker" \
    --sizes "${BENCH_CURVE_SIZES:-1,8,32,128}" --reps "${BENCH_CURVE_REPS:-15}" \
    --token "$bench_token" --json "$results_dir/bench-spawn-curve.json"
  log "raw results: $results_dir/bench-spawn-curve.json"
fi
