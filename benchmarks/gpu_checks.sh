#!/usr/bin/env bash
# The checks of issue 18 that need a GPU and are not yet shown (RESULTS.md §12, §14), as one run
# that ends within a lent machine's 10-minute call: CartPole PPO with 14 actors against 2 and a GPU
# learner, the candidate config, seeds 0–2; then, while time is left, LunarLander's shipped PPO
# config (captured) on seeds 3 and 4, beyond the three of §14. The tables go to $1 (default: $OUT,
# the device tool's folder that comes back): one log and a JSON per comparison, 6 files; the run
# directories to /tmp. rlmq's dependencies must be installed there first (the device tool's README
# says how to carry wheels; §14 names those carried).
#
#   bash benchmarks/gpu_checks.sh [OUT_DIR]
set -uo pipefail
out=${1:-${OUT:-/tmp/rlmq-gpu-checks}}
runs=/tmp/rlmq-gpu-checks/runs
deadline_s=570  # each comparison is cut off here, so that the call ends before its 600 s
mkdir -p "$out" "$runs"
export PYTHONUNBUFFERED=1

scaling() {  # NAME SEED LEAST_S ARGS...: 14 × 1 against 2 × 1 on the GPU, if LEAST_S seconds are left
    local name=$1 seed=$2 least=$3 left=$((deadline_s - SECONDS))
    shift 3
    if ((left < least)); then
        echo "$name seed $seed left out: ${left} s left"
        return
    fi
    timeout "$left" python benchmarks/bench_scaling.py --grid 14x1 2x1 --devices cuda --seed "$seed" \
        --out-dir "$runs/$name-s$seed" --json "$out/$name-s$seed.json" "$@" ||
        echo "$name seed $seed: exit $?"
}

checks() {
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    for seed in 0 1 2; do
        scaling cartpole "$seed" 60 --config benchmarks/ppo-cartpole-fleet.toml --target-return 475 \
            --total-steps 1000000 --timeout-s 90
    done
    local lunar=$runs/ppo-lunarlander-captured.toml
    { echo 'compile_update = "cuda-graphs"'; cat configs/ppo-lunarlander.toml; } > "$lunar"
    for seed in 3 4; do  # 2 actors took 72–96 s to 200 in §14, 14 actors 22–28 s
        scaling lunarlander "$seed" 200 --env LunarLander-v3 --config "$lunar" --target-return 200 \
            --total-steps 3000000 --timeout-s 150
    done
}

checks 2>&1 | tee "$out/gpu_checks.log"
