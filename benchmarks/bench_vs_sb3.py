"""rlmq against Stable-Baselines3 PPO on CartPole-v1: wall time to a return of 475, and env-steps/s.

For each seed, one after the other (never at the same time):

rlmq  `python -m rlmq.cli up --actors 4 --learners 2 --env CartPole-v1 --algo ppo --target-return 475
      --seed K --run-dir DIR`, then DIR/summary.json: `train_wall_s` (first env step → target, as
      the coordinator saw it), `env_steps` (valid steps: autoreset steps are not counted),
      `startup_s` (launch → first env step) and `success`.
SB3   PPO with RL-Zoo's CartPole-v1 hyperparameters (n_envs 8 via `make_vec_env` + DummyVecEnv,
      MlpPolicy, n_steps 32, batch_size 256, gae_lambda 0.8, gamma 0.98, n_epochs 20, ent_coef 0,
      learning rate linear 1e-3 → 0 and clip range linear 0.2 → 0 over RL-Zoo's n_timesteps 1e5,
      i.e. `learn(total_timesteps=1e5)`). A callback keeps the last 100 finished episode returns
      (Monitor's `infos[i]["episode"]`) and stops once their mean is ≥ 475 (the coordinator's rule
      too: 100 episodes, mean ≥ target). Wall time runs from its first call (just after the first
      env step) to the target; env steps are `model.num_timesteps`. Model construction is excluded.
      Not reached within 1e5 steps: recorded as missed. `--sb3-continue` goes on to `--sb3-budget`
      with `learn(..., reset_num_timesteps=False)` (SB3 then re-spreads the schedules over the
      longer total, so the learning rate jumps back up); such a result is marked `continued`.
      `--sb3-budget` below 1e5 cuts the run short with the 1e5 schedule kept (for smoke runs).
      Torch gets 1 intra-op thread (`--sb3-threads`), as each rlmq learner does: for a 64×64 MLP
      more threads only fight over shared cores (on a busy 2-core host, 2 threads ran ~25× slower).

rlmq's env steps are the coordinator's count when it declared the end (parsed from summary.json's
`detail`; `env_steps` there keeps counting while actors wind down), and count valid steps only;
SB3's DummyVecEnv resets within the step, so it has no such steps to leave out.

Ratios printed (medians over seeds; wall-to-target only over seeds where both reached it):
rlmq wall-to-target / SB3 (target ≤ 0.5), rlmq env-steps/s during training / SB3 (target ≥ 2),
and rlmq start-up time. `--json PATH` writes every figure.

    python benchmarks/bench_vs_sb3.py --seeds 0 1 2 --json runs/bench_vs_sb3.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

TARGET = 475.0
ENV_ID = "CartPole-v1"
ZOO_TIMESTEPS = 100_000  # RL-Zoo's n_timesteps for PPO on CartPole-v1: the schedules' horizon


def run_rlmq(
    seed: int, run_dir: Path, args: argparse.Namespace, env_id: str = ENV_ID, algo: str = "ppo", target: float = TARGET
) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "rlmq.cli",
        "up",
        "--actors",
        str(args.actors),
        "--learners",
        str(args.learners),
        "--env",
        env_id,
        "--algo",
        algo,
        "--target-return",
        str(target),
        "--seed",
        str(seed),
        "--run-dir",
        str(run_dir),
    ]
    if args.rlmq_total_steps is not None:
        argv += ["--total-steps", str(args.rlmq_total_steps)]
    if args.rlmq_config is not None:
        argv += ["--config", str(args.rlmq_config)]
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(run_dir.parent / f"{run_dir.name}.log", "wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(args.rlmq_timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # the supervisor stops its children warmly
            try:
                code = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
    wall = time.perf_counter() - started
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    # summary.json's env_steps keeps counting while the actors wind down after the end; the
    # coordinator's `detail` holds the count at the end ("... at N env steps", "N env steps ≥ ...").
    at_end = re.search(r"(\d+) env steps", summary.get("detail") or "")
    steps = int(at_end.group(1)) if at_end else int(summary.get("env_steps", 0))
    train_s = summary.get("train_wall_s")
    return {
        "exit_code": code,
        "success": bool(summary.get("success")),
        "outcome": summary.get("outcome"),
        "detail": summary.get("detail"),
        "env_steps": steps,
        "env_steps_summary": summary.get("env_steps"),
        "startup_s": summary.get("startup_s"),
        "train_wall_s": train_s,
        "process_wall_s": wall,
        "steps_per_s": steps / train_s if train_s else None,
        "run_dir": str(run_dir),
    }


def linear_schedule(initial: float) -> Any:
    """RL-Zoo's `lin_<x>`: SB3 passes progress_remaining, 1 → 0 over learn()'s total_timesteps."""

    def schedule(progress_remaining: float) -> float:
        return progress_remaining * initial

    return schedule


def run_sb3(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv

    class StopAtTarget(BaseCallback):
        def __init__(self, budget: int) -> None:
            super().__init__()
            self.budget = budget
            self.returns: deque[float] = deque(maxlen=100)
            self.first_step_at: float | None = None
            self.reached_at: float | None = None
            self.steps_at_target: int | None = None

        def _on_step(self) -> bool:
            now = time.perf_counter()
            if self.first_step_at is None:
                self.first_step_at = now
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
            if len(self.returns) == self.returns.maxlen and sum(self.returns) / len(self.returns) >= TARGET:
                self.reached_at, self.steps_at_target = now, self.num_timesteps
                return False
            return self.num_timesteps < self.budget

    if args.sb3_threads > 0:
        torch.set_num_threads(args.sb3_threads)
    env = make_vec_env(ENV_ID, n_envs=8, seed=seed, vec_env_cls=DummyVecEnv)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=linear_schedule(1e-3),
        clip_range=linear_schedule(0.2),
        seed=seed,
        device=args.sb3_device,
        verbose=0,
    )
    callback = StopAtTarget(args.sb3_budget)
    model.learn(total_timesteps=ZOO_TIMESTEPS, callback=callback)
    continued = False
    if callback.reached_at is None and args.sb3_continue and model.num_timesteps < args.sb3_budget:
        continued = True
        model.learn(total_timesteps=args.sb3_budget - model.num_timesteps, callback=callback, reset_num_timesteps=False)
    end = callback.reached_at or time.perf_counter()
    env.close()
    wall = end - (callback.first_step_at or end)
    steps = model.num_timesteps if callback.steps_at_target is None else callback.steps_at_target
    returns = list(callback.returns)
    return {
        "success": callback.reached_at is not None,
        "continued": continued,
        "env_steps": steps,
        "train_wall_s": wall,
        "steps_per_s": steps / wall if wall > 0 else None,
        "mean_return_last_100": sum(returns) / len(returns) if returns else None,
        "torch_threads": torch.get_num_threads(),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def fmt(value: Any, spec: str, width: int) -> str:
    return f"{'—' if value is None else format(value, spec):>{width}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("runs") / f"bench-vs-sb3-{time.strftime('%Y%m%d-%H%M%S')}",
        help="where the rlmq run directories (and their logs) go",
    )
    parser.add_argument("--json", type=Path, default=None, help="write all results here as JSON")
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--learners", type=int, default=2)
    parser.add_argument(
        "--rlmq-total-steps", type=int, default=None, help="rlmq step budget (default: the run config's)"
    )
    parser.add_argument("--rlmq-timeout-s", type=float, default=1800.0)
    parser.add_argument(
        "--rlmq-config",
        type=Path,
        default=None,
        help="run config for rlmq, as RL-Zoo's per-env hyperparameters are for SB3 "
        "(e.g. configs/ppo-cartpole.toml); default: the library defaults",
    )
    parser.add_argument(
        "--sb3-budget", type=int, default=300_000, help="SB3 env-step cap; beyond 1e5 only with --sb3-continue"
    )
    parser.add_argument(
        "--sb3-continue", action="store_true", help="target missed at 1e5 steps: keep training up to --sb3-budget"
    )
    parser.add_argument(
        "--sb3-threads",
        type=int,
        default=1,
        help="torch intra-op threads for SB3 (0: torch's default; see the docstring)",
    )
    parser.add_argument("--sb3-device", default="cpu")
    parser.add_argument("--skip-rlmq", action="store_true")
    parser.add_argument("--skip-sb3", action="store_true")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    if cores < args.actors + args.learners + 1:
        print(
            f"note: {cores} cores for {args.actors} actors + {args.learners} learners + coordinator: "
            "rlmq's figures will be core-bound",
            file=sys.stderr,
        )

    results: list[dict[str, Any]] = []
    for seed in args.seeds:
        row: dict[str, Any] = {"seed": seed}
        if not args.skip_rlmq:
            print(f"seed {seed}: rlmq up ...", flush=True)
            row["rlmq"] = run_rlmq(seed, args.out_dir / f"rlmq-seed{seed}", args)
        if not args.skip_sb3:
            print(f"seed {seed}: SB3 PPO ...", flush=True)
            row["sb3"] = run_sb3(seed, args)
        rl, sb = row.get("rlmq", {}), row.get("sb3", {})
        both = rl.get("success") and sb.get("success")
        row["wall_ratio"] = ratio(rl.get("train_wall_s"), sb.get("train_wall_s")) if both else None
        row["steps_per_s_ratio"] = ratio(rl.get("steps_per_s"), sb.get("steps_per_s"))
        results.append(row)

    print(
        f"\n{'seed':>4} | {'rlmq ok':>7} {'wall s':>8} {'steps':>9} {'steps/s':>9} {'start s':>7} | "
        f"{'SB3 ok':>6} {'wall s':>8} {'steps':>9} {'steps/s':>9} | {'wall ratio':>10} {'rate ratio':>10}"
    )
    for row in results:
        rl, sb = row.get("rlmq", {}), row.get("sb3", {})
        sb_ok = None if not sb else f"{sb['success']}{'*' if sb['continued'] else ''}"
        print(
            f"{row['seed']:>4} | {fmt(rl.get('success'), '', 7)} {fmt(rl.get('train_wall_s'), '.1f', 8)} "
            f"{fmt(rl.get('env_steps'), 'd', 9)} {fmt(rl.get('steps_per_s'), ',.0f', 9)} "
            f"{fmt(rl.get('startup_s'), '.1f', 7)} | {fmt(sb_ok, '', 6)} {fmt(sb.get('train_wall_s'), '.1f', 8)} "
            f"{fmt(sb.get('env_steps'), 'd', 9)} {fmt(sb.get('steps_per_s'), ',.0f', 9)} | "
            f"{fmt(row['wall_ratio'], '.3f', 10)} {fmt(row['steps_per_s_ratio'], '.3f', 10)}"
        )
    summary = {
        "wall_to_target_ratio_median": median([r["wall_ratio"] for r in results]),
        "steps_per_s_ratio_median": median([r["steps_per_s_ratio"] for r in results]),
        "rlmq_startup_s_median": median([r.get("rlmq", {}).get("startup_s") for r in results]),
        "seeds_both_reached_target": sum(r["wall_ratio"] is not None for r in results),
    }
    if any(r.get("sb3", {}).get("continued") for r in results):
        print("(* SB3 continued past RL-Zoo's 1e5-step schedule)")
    print(
        f"rlmq wall-to-target / SB3 : {fmt(summary['wall_to_target_ratio_median'], '.3f', 6)}  (target ≤ 0.5; "
        f"{summary['seeds_both_reached_target']}/{len(results)} seeds where both reached {TARGET:g})"
    )
    print(f"rlmq env-steps/s / SB3    : {fmt(summary['steps_per_s_ratio_median'], '.3f', 6)}  (target ≥ 2)")
    print(f"rlmq start-up             : {fmt(summary['rlmq_startup_s_median'], '.1f', 6)} s (median)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"config": config, "seeds": results, "summary": summary}, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
