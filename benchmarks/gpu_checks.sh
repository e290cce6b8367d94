#!/usr/bin/env bash
# The checks of issue 18 that need a GPU and are not yet shown (RESULTS.md §12, §14), as one run
# that fits a lent machine's 10-minute call: CartPole PPO with 14 actors against 2, a GPU learner,
# the candidate config, three seeds. The tables (a log and a JSON per seed, 7 files in all) go to
# $1 (default: $OUT, the device tool's folder that comes back); the run directories to /tmp.
#
#   bash benchmarks/gpu_checks.sh [OUT_DIR]
set -euo pipefail
out=${1:-${OUT:-/tmp/rlmq-gpu-checks}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
for seed in 0 1 2; do
    python benchmarks/bench_scaling.py --grid 14x1 2x1 --devices cuda \
        --config benchmarks/ppo-cartpole-fleet.toml --target-return 475 --total-steps 1000000 \
        --seed "$seed" --timeout-s 150 --out-dir "/tmp/rlmq-gpu-checks/cartpole-s$seed" \
        --json "$out/cartpole-s$seed.json" 2>&1 | tee "$out/cartpole-s$seed.log"
done
