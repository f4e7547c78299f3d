#!/usr/bin/env bash
# The main job: a real distributed data-parallel training on this machine's CPUs, launched by ddprun.
# Installs the dependencies, builds ddprun (Release), then trains scripts/examples/ddp_train.py with one
# worker per CPU core (gloo backend) and checks that every rank ends with identical parameters.
#   scripts/run-main-job.sh                      # nproc = number of cores, 300 steps
#   NPROC=4 STEPS=1000 scripts/run-main-job.sh   # other sizes; extra arguments go to ddprun's script
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

build=${DDPRUN_BUILD_DIR:-build-release}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DDDPRUN_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target ddprun

nproc=${NPROC:-$(nproc)}
steps=${STEPS:-300}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$build/launcher/ddprun" --standalone --nproc_per_node "$nproc" --python /usr/bin/python3 \
  scripts/examples/ddp_train.py --steps "$steps" --out "$out" "$@"
agree=$(grep -l '"identical": true' "$out"/rank*.json | wc -l)
echo "main job: $nproc ranks trained $steps steps; $agree of $nproc ranks report identical parameters"
[[ "$agree" == "$nproc" ]]
