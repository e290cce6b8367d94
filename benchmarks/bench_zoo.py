"""rlmq against Stable-Baselines3 with RL-Zoo's hyperparameters: final evaluation return and wall
time on the same env-step budget, side by side on this machine.

For each case and seed, one run after the other (never at the same time):

    rlmq  `python -m rlmq.cli up --actors 2 --learners 1 --env ENV --algo ALGO --seed K` with no
          --config: the shipped config for the pair is picked (its budget is the case's budget).
    SB3   the algorithm with RL-Zoo's hyperparameters for the env (rl-baselines3-zoo,
          hyperparams/{algo}.yml as of 2026; TD3's entry trains one step per env step since 2024,
          where the published 207 trained once per episode), RL-Zoo's n_envs,
          `learn(total_timesteps=budget)`, torch on `--sb3-threads` intra-op threads.

Both final policies are then evaluated by the same protocol (`rlmq.common.episodes.play`): 20
episodes, deterministic actions, episode i from reset(seed=1000 + i). Wall time: rlmq's whole
`rlmq up` (start-up included), SB3's `learn`; beside it the CPU seconds each spent (all of rlmq's
processes; SB3's one), which another load on the machine inflates far less than the wall time.
Printed per seed, then each side's median and the ratios rlmq / SB3 (return: ≥ 1 wanted; wall time:
≤ 0.5 wanted). The case's budget is passed to `rlmq up` as --total-steps (the SAC config's own is
200 k).

    python benchmarks/bench_zoo.py --cases ppo-lunarlander dqn-lunarlander --seeds 0 1 2 --json runs/zoo.json

The JSON is written after each side of every seed, merged seed by seed into what the file holds (so
benches of other seeds may write the same file at the same time); `--resume` keeps what it already
holds (a seed whose rlmq side finished runs only its SB3 side), so a case longer than one sitting
(SB3's SAC and TD3 take about an hour a seed on one core) can go on later.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlmq.cli.evaluate import evaluate, load_checkpoint
from rlmq.common.episodes import play

EVAL_EPISODES, EVAL_SEED = 20, 1000


@dataclass(frozen=True)
class Case:
    env_id: str
    algo: str
    budget: int  # env steps, both sides (the budget; rlmq's --total-steps overrides its config's)
    sb3: Callable[[Any, int], Any]  # (vec env, seed) → SB3 model with RL-Zoo's hyperparameters
    sb3_envs: int  # RL-Zoo's n_envs


def _ppo_lunarlander(env: Any, seed: int) -> Any:
    from stable_baselines3 import PPO

    return PPO(
        "MlpPolicy",
        env,
        n_steps=1024,
        batch_size=64,
        gae_lambda=0.98,
        gamma=0.999,
        n_epochs=4,
        ent_coef=0.01,
        seed=seed,
        device="cpu",
        verbose=0,
    )


def _dqn_lunarlander(env: Any, seed: int) -> Any:
    from stable_baselines3 import DQN

    # RL-Zoo's ε schedule in env steps (12 % of its 100 k), over this case's 300 k budget.
    return DQN(
        "MlpPolicy",
        env,
        learning_rate=6.3e-4,
        batch_size=128,
        buffer_size=50_000,
        learning_starts=0,
        gamma=0.99,
        target_update_interval=250,
        train_freq=4,
        gradient_steps=-1,
        exploration_fraction=0.04,
        exploration_final_eps=0.1,
        policy_kwargs={"net_arch": [256, 256]},
        seed=seed,
        device="cpu",
        verbose=0,
    )


def _sac_lunarlander_continuous(env: Any, seed: int) -> Any:
    from stable_baselines3 import SAC

    return SAC(
        "MlpPolicy",
        env,
        learning_rate=lambda remaining: 7.3e-4 * remaining,
        batch_size=256,
        buffer_size=1_000_000,
        ent_coef="auto",
        gamma=0.99,
        tau=0.01,
        train_freq=1,
        gradient_steps=1,
        learning_starts=10_000,
        policy_kwargs={"net_arch": [400, 300]},
        seed=seed,
        device="cpu",
        verbose=0,
    )


def _td3_lunarlander_continuous(env: Any, seed: int) -> Any:
    from stable_baselines3 import TD3
    from stable_baselines3.common.noise import NormalActionNoise

    return TD3(
        "MlpPolicy",
        env,
        gamma=0.98,
        buffer_size=200_000,
        learning_starts=10_000,
        action_noise=NormalActionNoise(np.zeros(2), 0.1 * np.ones(2)),
        gradient_steps=1,
        train_freq=1,
        learning_rate=1e-3,
        policy_kwargs={"net_arch": [400, 300]},
        seed=seed,
        device="cpu",
        verbose=0,
    )


CASES = {
    "ppo-lunarlander": Case("LunarLander-v3", "ppo", 1_000_000, _ppo_lunarlander, 16),
    "dqn-lunarlander": Case("LunarLander-v3", "dqn", 300_000, _dqn_lunarlander, 1),
    "sac-lunarlandercontinuous": Case("LunarLanderContinuous-v3", "sac", 300_000, _sac_lunarlander_continuous, 1),
    "td3-lunarlandercontinuous": Case("LunarLanderContinuous-v3", "td3", 300_000, _td3_lunarlander_continuous, 1),
}


def _children_cpu_s() -> float:
    """CPU seconds of every finished descendant (`rlmq up` waits for its services, so theirs count)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_rlmq(case: Case, seed: int, run_dir: Path, timeout_s: float) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "rlmq.cli",
        "up",
        "--actors",
        "2",
        "--learners",
        "1",
        "--env",
        case.env_id,
        "--algo",
        case.algo,
        "--seed",
        str(seed),
        "--total-steps",
        str(case.budget),
        "--run-dir",
        str(run_dir),
    ]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    started, cpu_started = time.perf_counter(), _children_cpu_s()
    with open(run_dir.parent / f"{run_dir.name}.log", "wb") as log:
        code = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s
        ).returncode
    wall, cpu = time.perf_counter() - started, _children_cpu_s() - cpu_started
    result = evaluate(load_checkpoint(run_dir), EVAL_EPISODES, EVAL_SEED)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "exit": code,
        "wall_s": wall,
        "cpu_s": cpu,
        "env_steps": summary["env_steps"],
        "eval_mean": result.mean,
        "eval_std": result.std,
    }


def run_sb3(case: Case, seed: int, threads: int) -> dict[str, Any]:
    import torch
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(threads)
    env = make_vec_env(case.env_id, n_envs=case.sb3_envs, seed=seed)
    model = case.sb3(env, seed)
    started, cpu_started = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=case.budget)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    env.close()
    result = play(case.env_id, lambda obs: model.predict(obs, deterministic=True)[0], EVAL_EPISODES, EVAL_SEED)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "env_steps": int(model.num_timesteps),
        "eval_mean": result.mean,
        "eval_std": result.std,
    }


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(case: Case, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each side's medians over the seeds both sides finished (with --skip-sb3, rlmq's over all),
    and the ratios rlmq / SB3."""
    counted = [r for r in rows if "sb3" in r] or rows
    sides = {
        side: {
            key: median([r[side][key] for r in counted if key in r.get(side, {})])
            for key in ("eval_mean", "wall_s", "cpu_s")
        }  # cpu_s: rows from before it was kept lack it
        for side in ("rlmq", "sb3")
    }
    rl, sb = sides["rlmq"], sides["sb3"]
    ratios = {
        "return": rl["eval_mean"] / sb["eval_mean"] if sb["eval_mean"] else None,
        "wall": rl["wall_s"] / sb["wall_s"] if sb["wall_s"] else None,
        "cpu": rl["cpu_s"] / sb["cpu_s"] if rl["cpu_s"] and sb["cpu_s"] else None,
    }
    return {"budget": case.budget, "seeds": rows, "median": sides, "ratio": ratios}


def print_table(name: str, summary: dict[str, Any]) -> None:
    rl, sb, ratios = summary["median"]["rlmq"], summary["median"]["sb3"], summary["ratio"]
    print(f"\n{name}: {summary['budget']:,} env steps, eval {EVAL_EPISODES} episodes deterministic")
    print(f"{'seed':>4} | {'rlmq return':>12} {'wall s':>8} | {'SB3 return':>12} {'wall s':>8}")
    for r in summary["seeds"]:
        s = r.get("sb3", {})
        print(
            f"{r['seed']:>4} | {r['rlmq']['eval_mean']:>12.1f} {r['rlmq']['wall_s']:>8.1f} | "
            f"{s.get('eval_mean', float('nan')):>12.1f} {s.get('wall_s', float('nan')):>8.1f}"
        )
    print(
        f"median | {rl['eval_mean']:>10.1f} {rl['wall_s']:>8.1f} | {sb['eval_mean'] or float('nan'):>12.1f} "
        f"{sb['wall_s'] or float('nan'):>8.1f}   ratio return {ratios['return']}, wall {ratios['wall']}, "
        f"CPU {ratios['cpu']}\n"
    )


def keep_in_json(path: Path, name: str, case: Case, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge `rows` into the JSON's entry for the case, seed by seed, and return the case's summary.
    Under a lock, and read afresh each time, so that benches of other seeds or cases writing the same
    file (`--seeds 2` in a second process) keep each other's rows; a seed with both sides is never
    replaced by one with rlmq's alone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)  # the lock: the file itself is replaced whole
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        report = json.loads(path.read_text()) if path.exists() else {}
        seeds = {r["seed"]: r for r in report.get(name, {}).get("seeds", [])}
        for row in rows:
            if "sb3" in row or "sb3" not in seeds.get(row["seed"], {}):
                seeds[row["seed"]] = row
        report[name] = summarize(case, [seeds[seed] for seed in sorted(seeds)])
        scratch = path.with_name(path.name + ".tmp")
        scratch.write_text(json.dumps(report, indent=2))
        scratch.replace(path)
    finally:
        os.close(folder)  # and the lock with it
    return dict(report[name])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=sorted(CASES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sb3-threads", type=int, default=1)
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--rlmq-timeout-s", type=float, default=7200.0)
    parser.add_argument("--out-dir", type=Path, default=Path("runs") / f"bench-zoo-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--json", type=Path, default=None, help="written after each side of every seed")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep what --json already holds (whole seeds, and rlmq sides whose SB3 side is "
        "missing), run the rest: a bench longer than a session, each seed's pair still run "
        "one after the other",
    )
    args = parser.parse_args()
    if args.resume and args.json is None:
        parser.error("--resume needs --json, the file that holds the seeds already run")

    done: dict[str, Any] = json.loads(args.json.read_text()) if args.resume and args.json.exists() else {}
    for name in args.cases:
        case, rows = CASES[name], []
        held = {r["seed"]: r for r in done.get(name, {}).get("seeds", []) if "rlmq" in r}
        for seed in args.seeds:
            row = held.get(seed)
            if row is not None and ("sb3" in row or args.skip_sb3):
                print(f"{name} seed {seed}: kept from {args.json}", flush=True)
                rows.append(row)
                continue
            if row is None:
                print(f"{name} seed {seed}: rlmq ...", flush=True)
                row = {
                    "seed": seed,
                    "rlmq": run_rlmq(case, seed, args.out_dir / f"{name}-seed{seed}", args.rlmq_timeout_s),
                }
                print(f"  rlmq {row['rlmq']}", flush=True)
                if args.json is not None:  # kept alone, should the SB3 side not finish in this sitting
                    keep_in_json(args.json, name, case, [*rows, row])
            else:
                print(f"{name} seed {seed}: rlmq side kept from {args.json}", flush=True)
            if not args.skip_sb3:
                print(f"{name} seed {seed}: SB3 ...", flush=True)
                row["sb3"] = run_sb3(case, seed, args.sb3_threads)
                print(f"  SB3  {row['sb3']}", flush=True)
            rows.append(row)
            if args.json is not None:  # a seed's pair is kept even if a later one never finishes
                keep_in_json(args.json, name, case, rows)
        # the table: this bench's seeds, with whatever other processes have added to the JSON
        print_table(name, keep_in_json(args.json, name, case, rows) if args.json else summarize(case, rows))
    if args.json is not None:
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
