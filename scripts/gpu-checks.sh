#!/usr/bin/env bash
# Every GPU check of ddprun in one run, for a machine with an NVIDIA GPU, CUDA, NCCL and a CUDA build of torch
# (the device tool's H200: torch 2.11+cu130 from pip, CUDA 13 under /usr/local/cuda, NCCL from pip's
# nvidia-nccl-cu13). With one GPU, two ranks share it through a distinct NCCL_HOSTID each (NCCL then takes
# them for two hosts and connects them over sockets).
#   0. the machine: GPU, driver, torch, CUDA, NCCL, compiler, glibc;
#   1. scripts/bench-gpu.sh: builds ddprun, the SDK and its tests against this torch and NCCL, runs the NCCL
#      test cases, the SDK's all-reduce against raw ncclAllReduce, the example trainer against torch DDP;
#   2. CUDA torch DDP under ddprun (scripts/examples/ddp_train.py --device cuda): `--nproc_per_node gpu`;
#      two ranks on the GPU, one crashes, the group restarts from the checkpoint (the GPU-memory wait before
#      the restart, on the real driver); the built-in NVML health check's lines;
#   3. a rank that stops while its peer waits in an NCCL all-reduce, with --hang_timeout (torch's flight
#      recorder on): NCCL's watchdog ends the peer, the failure summary names the flight recorder's dump;
#   4. the GPU-memory wait when an escaped process keeps the GPU memory of a crashed rank.
# Each step has a time limit and the run goes on after a failure; the verdicts are in OUT/gpu-checks.txt,
# every log in OUT/gpu-logs.tar.gz.
#
#   scripts/gpu-checks.sh OUT [DEPS.tar.xz]
#
# DEPS.tar.xz (scripts/gpu-deps-bundle.sh): the build dependencies, unpacked into /opt/ddprun-deps first, for
# a machine without Debian's packages. Environment: TORCH_PYTHON (python3), GPU_CHECKS_BUDGET (570 s for the
# whole run), GPU_CHECKS_ONLY (e.g. "2b,3": the launcher checks to run; the build always runs), BENCH_PARTS
# and BENCH_STEPS (scripts/bench-gpu.sh), GPU_HANG_LIMIT (150 s for check 3: torch 2.11 ended the waiting rank
# about 60 s after its 30 s timeout). The whole run took about 4 minutes on an H200 with 16 CPUs.
# Exit status: 0 when every check passed, 1 otherwise.
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:?usage: scripts/gpu-checks.sh OUT [DEPS.tar.xz]}" && cd "$1" && pwd)
deps=${2:-}
python=${TORCH_PYTHON:-python3}
work=$(mktemp -d /tmp/gpu-checks.XXXXXX)
build=$work/build
verdicts=$out/gpu-checks.txt
: >"$verdicts"
failed=0
only=,${GPU_CHECKS_ONLY:-2a,2b,3,4},
want() { [[ $only == *,$1,* ]]; }
say() { echo "gpu-checks: $*" | tee -a "$verdicts" >&2; }
verdict() { # NAME OK(0/1) DETAIL
  if [[ $2 == 0 ]]; then say "PASS $1: $3"; else
    say "FAIL $1: $3"
    failed=1
  fi
}
pack_logs() { tar -C "$work" -czf "$out/gpu-logs.tar.gz" --exclude=build/CMakeFiles --exclude='*.o' \
  --exclude='*.so' --exclude='*.a' logs build/bench-gpu.txt build/configure.log build/build.log 2>/dev/null; }
trap pack_logs EXIT
mkdir -p "$work/logs"
started=$(date +%s)
budget=${GPU_CHECKS_BUDGET:-570} # seconds for the whole run: each step gets at most what is left
elapsed() { echo "$(($(date +%s) - started)) s"; }
limit() { # CAP: CAP seconds, or what is left of the budget when less (at least 5)
  local left=$((budget - ($(date +%s) - started)))
  echo $((left < $1 ? (left > 5 ? left : 5) : $1))
}

say "== 0. the machine"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())), "gpus", torch.cuda.device_count())'
  /usr/local/cuda/bin/nvcc --version | tail -1
  c++ --version | head -1
  ldd --version | head -1
  echo "cpus $(nproc)"
} 2>&1 | tee -a "$verdicts"

if [[ -n $deps ]]; then
  mkdir -p /opt/ddprun-deps && tar -C /opt/ddprun-deps -xJf "$deps" || { say "cannot unpack $deps"; exit 1; }
  export DDPRUN_DEPS_PREFIX=/opt/ddprun-deps/usr
fi

say "== 1. build and the SDK's checks (scripts/bench-gpu.sh) [$(elapsed)]"
BENCH_STEPS=${BENCH_STEPS:-100} timeout "$(limit 330)" "$repo/scripts/bench-gpu.sh" "$build"
rc=$?
cat "$build/bench-gpu.txt" >>"$verdicts" 2>/dev/null
verdict bench-gpu $rc "scripts/bench-gpu.sh exit $rc [$(elapsed)]"
ddprun=$build/launcher/ddprun
[[ -x $ddprun ]] || { say "no ddprun was built: the launcher checks cannot run"; exit 1; }

train=$repo/scripts/examples/ddp_train.py
# Local rank N as host hN for NCCL: two ranks on one GPU.
hostid=$work/with_hostid.sh
printf '#!/bin/sh\nexport NCCL_HOSTID=ddprun-h$LOCAL_RANK NCCL_SOCKET_IFNAME=lo\nexec %s "$@"\n' "$python" >"$hostid"
chmod +x "$hostid"
result_ok() { # DIR RANKS ATTEMPT: every rank wrote identical parameters in that attempt
  "$python" - "$@" <<'EOF'
import json, sys
d, ranks, attempt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rs = [json.load(open(f"{d}/rank{r}.json")) for r in range(ranks)]
ok = all(r["identical"] and r["attempt"] == attempt for r in rs) and len({r["checksum"] for r in rs}) == 1
print(f"{ranks} ranks, attempt {rs[0]['attempt']}, checksum {rs[0]['checksum']:.6f}, identical {ok}")
sys.exit(0 if ok else 1)
EOF
}

# ID NAME RANKS ATTEMPT LIMIT PATTERN DDPRUN_ARGS...: a standalone ddprun job of ddp_train.py (its options at
# the end of DDPRUN_ARGS) that must exit 0 with every rank's parameters identical in attempt ATTEMPT; the lines
# of its output that match PATTERN go to the verdicts.
train_check() {
  local id=$1 name=$2 ranks=$3 attempt=$4 cap=$5 pattern=$6
  shift 6
  local log=$work/logs/$id.log
  timeout "$(limit "$cap")" "$ddprun" --standalone --log_dir "$work/logs/$id" "$@" --out "$work/$id" >"$log" 2>&1
  local rc=$?
  grep -E "$pattern" "$log" | tee -a "$verdicts"
  local detail same
  detail=$(result_ok "$work/$id" "$ranks" "$attempt" 2>&1)
  same=$?
  verdict "$name" "$((rc != 0 || same != 0))" "exit $rc; $detail"
  pack_logs
}

if want 2a; then
say "== 2a. CUDA torch DDP, --nproc_per_node gpu [$(elapsed)]"
train_check 2a cuda-ddp-gpu "$(nvidia-smi -L | wc -l)" 0 60 "NVML sees|health check|done:" \
  --nproc_per_node gpu --log_level debug --python "$python" "$train" --device cuda --steps 200
fi

if want 2b; then
say "== 2b. two ranks on the GPU (NCCL_HOSTID), rank 1 crashes at step 50, one restart from the checkpoint [$(elapsed)]"
train_check 2b cuda-ddp-restart 2 1 90 "NVML sees|GPU memory|restart|resumed|crashing|done:" \
  --nproc_per_node 2 --max_restarts 1 --no_python "$hostid" "$train" --device cuda --steps 150 --fail-rank 1 \
  --fail-step 50 --fail-until-attempt 1 --checkpoint "$work/2b.ckpt" --save-every 25
fi

if want 3; then
say "== 3. rank 1 stops, rank 0 waits in an NCCL all-reduce; --hang_timeout 20, NCCL timeout 30 s [$(elapsed)]"
log=$work/logs/3.log
timeout "$(limit "${GPU_HANG_LIMIT:-150}")" "$ddprun" --standalone --nproc_per_node 2 --hang_timeout 20 \
  --log_dir "$work/logs/3" --no_python "$hostid" "$train" --device cuda --steps 100000 --hang-rank 1 \
  --hang-step 20 --pg-timeout 30 >"$log" 2>&1 &
job=$!
# When does the job end after NCCL's watchdog fired? Noted once a second (torch's own teardown).
( while kill -0 $job 2>/dev/null; do
    n=$(grep -c "Watchdog caught" "$work"/logs/3/*/attempt_0/*/stderr.log 2>/dev/null | awk -F: '{s+=$2} END {print s+0}')
    [[ $n -gt 0 ]] && { echo "watchdog fired at $(date +%T)"; break; }
    sleep 1
  done ) >>"$verdicts" &
wait $job
rc=$?
grep -E "hang|progress|where the ranks|flight|nccl trace|exitcode|Watchdog|timeout" "$log" | head -40 | tee -a "$verdicts"
traces=$(find "$work/logs/3" -name 'nccl_trace_rank_*' ! -name '*.pipe' | sort)
say "flight-recorder dumps: ${traces:-none}; the job ended at $(date +%T)"
named=$(grep -c "nccl trace: " "$log")
verdict nccl-hang "$(((rc == 0 || rc == 124) || named == 0))" \
  "exit $rc (the job must fail, not time out); summary lines naming a dump: $named"
pack_logs

fi

if want 4; then
say "== 4. an escaped process keeps a crashed rank's GPU memory; --gpu_memory_wait 8 [$(elapsed)]"
log=$work/logs/4.log
hog=$work/hog.py
cat >"$hog" <<'EOF'
import os, sys, time
import torch
# The first attempt's rank 0 leaves a process of its own session holding 4 GiB of GPU memory for 20 s, then
# crashes; the restarted group must wait for it (at most --gpu_memory_wait) and then train.
if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0" and os.environ["LOCAL_RANK"] == "0":
    if os.fork() == 0:
        os.setsid()
        x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        time.sleep(20)
        os._exit(0)
    time.sleep(8)
    sys.exit(3)
x = torch.ones(1 << 20, device="cuda")
print("attempt", os.environ["TORCHELASTIC_RESTART_COUNT"], "sum", float(x.sum()), flush=True)
EOF
timeout "$(limit 60)" "$ddprun" --standalone --nproc_per_node 1 --max_restarts 1 --gpu_memory_wait 8 \
  --log_dir "$work/logs/4" --python "$python" "$hog" >"$log" 2>&1
rc=$?
grep -E "NVML|GPU memory|attempt 1|restart" "$log" | tee -a "$verdicts"
verdict gpu-memory-wait "$((rc != 0))" "exit $rc; $(grep -m1 -E "GPU memory" "$log" || echo "no line about the GPU-memory wait")"

fi

say "done in $(elapsed): $(grep -c '^gpu-checks: PASS' "$verdicts") passed, $(grep -c '^gpu-checks: FAIL' "$verdicts") failed"
exit $failed
