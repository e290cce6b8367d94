#!/usr/bin/env bash
# The checks of issue 18 that need a GPU and are not yet shown (RESULTS.md §12, §14), as one run
# that fits a lent machine's 10-minute call: CartPole PPO with 14 actors against 2 and a GPU learner,
# the candidate config, seeds 0–2; then, while the first 4.5 minutes last, LunarLander's shipped PPO
# config (captured) on seeds 3 and 4, beyond the three of §14. The tables go to $1 (default: $OUT,
# the device tool's folder that comes back): one log and a JSON per run, 7 files at most; the run
# directories to /tmp. rlmq's dependencies must be installed there first (the device tool's README
# says how to carry wheels; §14 names those carried).
#
#   bash benchmarks/gpu_checks.sh [OUT_DIR]
set -euo pipefail
out=${1:-${OUT:-/tmp/rlmq-gpu-checks}}
runs=/tmp/rlmq-gpu-checks/runs
mkdir -p "$out" "$runs"
export PYTHONUNBUFFERED=1
exec > >(tee "$out/gpu_checks.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

scaling() {  # NAME SEED ARGS...: one 14 × 1 against 2 × 1 comparison on the GPU
    local name=$1 seed=$2
    shift 2
    python benchmarks/bench_scaling.py --grid 14x1 2x1 --devices cuda --seed "$seed" \
        --out-dir "$runs/$name-s$seed" --json "$out/$name-s$seed.json" "$@"
}

for seed in 0 1 2; do
    scaling cartpole "$seed" --config benchmarks/ppo-cartpole-fleet.toml --target-return 475 \
        --total-steps 1000000 --timeout-s 150
done
lunar=$runs/ppo-lunarlander-captured.toml
{ echo 'compile_update = "cuda-graphs"'; cat configs/ppo-lunarlander.toml; } > "$lunar"
for seed in 3 4; do
    if ((SECONDS > 270)); then  # a seed takes up to 2 × 150 s: the call must end within 600
        echo "LunarLander seed $seed left out: ${SECONDS} s gone"
        continue
    fi
    scaling lunarlander "$seed" --env LunarLander-v3 --config "$lunar" --target-return 200 \
        --total-steps 3000000 --timeout-s 150
done
