#!/usr/bin/env bash
# The main job: a real distributed data-parallel training on this machine's CPUs, launched by ddprun.
# Installs the dependencies, builds ddprun and the worker SDK's example trainer (Release, with libtorch),
# then trains worker_sdk/examples/train_mlp.cc (ddprun-example-train: a libtorch MLP on synthetic data, the
# SDK's GradientSynchronizer over the CPU backend) with one worker per CPU core. Rank 0 logs loss and
# samples/s and writes a checkpoint; the job fails unless every rank ends with bit-identical parameters.
#   scripts/run-main-job.sh                         # nproc = number of cores, 300 steps
#   NPROC=4 STEPS=1000 scripts/run-main-job.sh      # other sizes; extra arguments go to the trainer
#   MAIN_JOB=python scripts/run-main-job.sh         # the same kind of job as a Python DDP (gloo) script
# Environment: DDPRUN_BUILD_DIR (build-release), CHECKPOINT (a file to keep and resume from; default: a
# temporary one). Exit code: the job's (0 on success; see docs/cli.md).
set -euo pipefail
cd "$(dirname "$0")/.."

kind=${MAIN_JOB:-cpp}
if [[ $kind != cpp && $kind != python ]]; then
  echo "run-main-job.sh: MAIN_JOB=$kind is not known; use cpp (default) or python" >&2
  exit 2
fi

scripts/install-deps.sh

build=${DDPRUN_BUILD_DIR:-build-release}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [[ $kind == cpp ]]; then
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DDDPRUN_BUILD_TESTS=OFF \
    -DDDPRUN_WITH_TORCH=ON >/dev/null
  cmake --build "$build" -j "$(nproc)" --target ddprun ddprun-example-train
else
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DDDPRUN_BUILD_TESTS=OFF >/dev/null
  cmake --build "$build" -j "$(nproc)" --target ddprun
fi

nproc=${NPROC:-$(nproc)}
steps=${STEPS:-300}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

case $kind in
  cpp)
    checkpoint=${CHECKPOINT:-$out/checkpoint.pt}
    # One intra-op thread per rank: the ranks already use every core.
    "$build/launcher/ddprun" --standalone --nproc_per_node "$nproc" --max_restarts 1 --no_python \
      "$build/worker_sdk/torch/ddprun-example-train" --steps "$steps" --threads 1 \
      --checkpoint "$checkpoint" --checkpoint-every 100 "$@"
    echo "main job: $nproc ranks trained $steps steps of the C++ example; every rank holds identical parameters"
    ;;
  python)
    "$build/launcher/ddprun" --standalone --nproc_per_node "$nproc" --python /usr/bin/python3 \
      scripts/examples/ddp_train.py --steps "$steps" --out "$out" "$@"
    agree=$(grep -l '"identical": true' "$out"/rank*.json | wc -l)
    echo "main job: $nproc ranks trained $steps steps; $agree of $nproc ranks report identical parameters"
    [[ "$agree" == "$nproc" ]]
    ;;
esac
