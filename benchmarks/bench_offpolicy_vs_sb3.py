"""rlmq against Stable-Baselines3 on the off-policy algorithms: wall time to the same threshold.

For each seed, one after the other (never at the same time), for `--algo`:

    algo  env            threshold                       rlmq config                SB3 (RL-Zoo hyperparameters)
    sac   Pendulum-v1    mean of the last 20 ≥ −200      configs/sac-pendulum.toml  SAC, lr 1e-3, 20 k steps
    td3   Pendulum-v1    mean of the last 20 ≥ −200      configs/td3-pendulum.toml  TD3, RL-Zoo's Pendulum-v1
    dqn   CartPole-v1    mean of the last 100 ≥ 475      configs/dqn-cartpole.toml  DQN, RL-Zoo's CartPole-v1

rlmq  `python -m rlmq.cli up --actors A --learners L --env ENV --algo ALGO --config CONFIG
      --target-return T --seed K` (see bench_vs_sb3.py for what is read from summary.json).
SB3   the algorithm with RL-Zoo's hyperparameters for that env, one env (RL-Zoo's n_envs), a callback
      that keeps the same window of finished-episode returns and stops at the threshold; wall time
      from its first env step; `learn(total_timesteps=RL-Zoo's n_timesteps)` (or `--sb3-steps`);
      not reached within that budget: recorded as missed, and where rlmq reached it, rlmq's time
      over SB3's whole budget's time is printed as an upper bound of the ratio ('< x'). torch on
      `--sb3-threads` (1) intra-op threads.

A window of 20 for Pendulum: its episodes are 200 steps, so a 20 k budget holds 100 episodes in all
and a 100-episode mean could only judge the whole run, not the policy at its end.

    python benchmarks/bench_offpolicy_vs_sb3.py --algo sac --seeds 0 1 2 --json runs/bench_sac.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque
from pathlib import Path
from typing import Any

from bench_vs_sb3 import fmt, median, ratio, run_rlmq

# algo → (env id, threshold, episodes in the window, rlmq config, SB3 n_timesteps)
TASKS: dict[str, tuple[str, float, int, str, int]] = {
    "sac": ("Pendulum-v1", -200.0, 20, "configs/sac-pendulum.toml", 20_000),
    "td3": ("Pendulum-v1", -200.0, 20, "configs/td3-pendulum.toml", 20_000),
    "dqn": ("CartPole-v1", 475.0, 100, "configs/dqn-cartpole.toml", 50_000),
}


def sb3_model(algo: str, env: Any, seed: int) -> Any:
    """RL-Zoo's hyperparameters (rl-baselines3-zoo, hyperparams/{algo}.yml) for the task's env."""
    import numpy as np
    from stable_baselines3 import DQN, SAC, TD3
    from stable_baselines3.common.noise import NormalActionNoise

    if algo == "sac":
        return SAC("MlpPolicy", env, learning_rate=1e-3, seed=seed, verbose=0, device="cpu")
    if algo == "td3":
        noise = NormalActionNoise(np.zeros(1), 0.1 * np.ones(1))
        return TD3(
            "MlpPolicy",
            env,
            learning_rate=1e-3,
            gamma=0.98,
            buffer_size=200_000,
            learning_starts=10_000,
            action_noise=noise,
            gradient_steps=-1,
            train_freq=(1, "episode"),
            policy_kwargs={"net_arch": [400, 300]},
            seed=seed,
            verbose=0,
            device="cpu",
        )
    return DQN(
        "MlpPolicy",
        env,
        learning_rate=2.3e-3,
        batch_size=64,
        buffer_size=100_000,
        learning_starts=1000,
        gamma=0.99,
        target_update_interval=10,
        train_freq=256,
        gradient_steps=128,
        exploration_fraction=0.16,
        exploration_final_eps=0.04,
        policy_kwargs={"net_arch": [256, 256]},
        seed=seed,
        verbose=0,
        device="cpu",
    )


def run_sb3(algo: str, seed: int, threads: int, steps: int | None = None) -> dict[str, Any]:
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    env_id, threshold, window, _, zoo_budget = TASKS[algo]
    budget = steps or zoo_budget

    class StopAtThreshold(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.returns: deque[float] = deque(maxlen=window)
            self.first_step_at: float | None = None
            self.reached_at: float | None = None
            self.steps_at_target: int | None = None

        def _on_step(self) -> bool:
            now = time.perf_counter()
            self.first_step_at = self.first_step_at or now
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
            if len(self.returns) == window and sum(self.returns) / window >= threshold:
                self.reached_at, self.steps_at_target = now, self.num_timesteps
                return False
            return True

    if threads > 0:
        torch.set_num_threads(threads)
    env = make_vec_env(env_id, n_envs=1, seed=seed)
    model = sb3_model(algo, env, seed)
    callback = StopAtThreshold()
    model.learn(total_timesteps=budget, callback=callback)
    end = callback.reached_at or time.perf_counter()
    env.close()
    wall = end - (callback.first_step_at or end)
    steps = callback.steps_at_target or model.num_timesteps
    returns = list(callback.returns)
    return {
        "success": callback.reached_at is not None,
        "env_steps": steps,
        "train_wall_s": wall,
        "steps_per_s": steps / wall if wall > 0 else None,
        "mean_return_window": sum(returns) / len(returns) if returns else None,
    }


def bounded(value: float | None, below: float | None) -> str:
    """A ratio, '<' an upper bound of one (SB3 never reached the threshold), or '—'."""
    if value is not None:
        return f"{value:.3f}"
    return f"< {below:.3f}" if below is not None else "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=sorted(TASKS), required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--learners", type=int, default=1)
    parser.add_argument("--rlmq-config", type=Path, default=None, help="default: the task's config above")
    parser.add_argument("--rlmq-total-steps", type=int, default=None)
    parser.add_argument("--rlmq-timeout-s", type=float, default=1800.0)
    parser.add_argument("--sb3-threads", type=int, default=1)
    parser.add_argument("--sb3-steps", type=int, default=None, help="SB3's budget; default: RL-Zoo's n_timesteps")
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument(
        "--out-dir", type=Path, default=Path("runs") / f"bench-offpolicy-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    env_id, threshold, window, config, _ = TASKS[args.algo]
    args.rlmq_config = args.rlmq_config or Path(config)

    results = []
    for seed in args.seeds:
        print(f"seed {seed}: rlmq up --algo {args.algo} ...", flush=True)
        row: dict[str, Any] = {
            "seed": seed,
            "rlmq": run_rlmq(seed, args.out_dir / f"rlmq-seed{seed}", args, env_id, args.algo, threshold),
        }
        if not args.skip_sb3:
            print(f"seed {seed}: SB3 {args.algo.upper()} ...", flush=True)
            row["sb3"] = run_sb3(args.algo, seed, args.sb3_threads, args.sb3_steps)
        rl, sb = row["rlmq"], row.get("sb3", {})
        row["wall_ratio"] = (
            ratio(rl.get("train_wall_s"), sb.get("train_wall_s")) if rl["success"] and sb.get("success") else None
        )
        # SB3 missed the threshold within its whole budget: its time to it is longer than the
        # budget took, so rlmq's time over the budget's bounds the ratio from above.
        row["wall_ratio_below"] = (
            ratio(rl.get("train_wall_s"), sb.get("train_wall_s"))
            if rl["success"] and sb and not sb.get("success")
            else None
        )
        results.append(row)

    print(f"\n{args.algo} on {env_id}, threshold {threshold:g} over the last {window} episodes")
    print(
        f"{'seed':>4} | {'rlmq ok':>7} {'wall s':>8} {'steps':>8} {'start s':>7} | {'SB3 ok':>6} {'wall s':>8} "
        f"{'steps':>8} {'mean':>7} | {'wall ratio':>10}"
    )
    for row in results:
        rl, sb = row["rlmq"], row.get("sb3", {})
        print(
            f"{row['seed']:>4} | {fmt(rl.get('success'), '', 7)} {fmt(rl.get('train_wall_s'), '.1f', 8)} "
            f"{fmt(rl.get('env_steps'), 'd', 8)} {fmt(rl.get('startup_s'), '.1f', 7)} | "
            f"{fmt(sb.get('success'), '', 6)} {fmt(sb.get('train_wall_s'), '.1f', 8)} "
            f"{fmt(sb.get('env_steps'), 'd', 8)} {fmt(sb.get('mean_return_window'), '.1f', 7)} | "
            f"{bounded(row['wall_ratio'], row['wall_ratio_below']):>10}"
        )
    summary = {
        "wall_to_target_ratio_median": median([r["wall_ratio"] for r in results]),
        "seeds_both_reached": sum(r["wall_ratio"] is not None for r in results),
        "seeds_only_rlmq_reached": sum(r["wall_ratio_below"] is not None for r in results),
    }
    print(
        f"rlmq wall-to-threshold / SB3: {fmt(summary['wall_to_target_ratio_median'], '.3f', 6)} (target ≤ 0.5; "
        f"{summary['seeds_both_reached']}/{len(results)} seeds where both reached it; "
        f"{summary['seeds_only_rlmq_reached']} where only rlmq did, ratio below the '<' bound shown)"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        config_doc = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"config": config_doc, "seeds": results, "summary": summary}, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
