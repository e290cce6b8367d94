"""Atari on whatever box this runs on: how fast its envs can go, how fast rlmq's actors and a whole
`rlmq up` training run go, and where their time goes; every figure measured in this one run.

1. **Env only** (random actions, no policy): the box's env limit, each path with the same cores
   (`--cores`, default the cores this process is given), all of them stepping at once in windows
   of `--window-s` after a warm-up (ROM loads and resets stay out):
     wrapper        the reference path (gymnasium's AtariPreprocessing + FrameStackObservation),
                    a process per core, `--num-envs` slots each (one core each: Python steps them);
     native         ale-py's AtariVectorEnv (the same preprocessing in C++), a process per core,
                    `--num-envs` slots on one C++ thread each;
     native-1proc   one process, `--num-envs` × cores slots on as many C++ threads.
2. **Acting** (an actor's loop, `Collector.collect`, with a fresh PPO policy of the shipped config
   and no learner), `--num-envs` slots a process: a process per core on the wrapper path (the
   actors' path before the native env), on the native path in one lane and in two, each with the
   CNN on the CPU; a process per two cores in two lanes on two threads; and, where there is a GPU,
   a process per core in two lanes with the CNN on the GPU. Each row says where the actor's time
   went (choosing actions, waiting for its envs).
   Both are measured in `--rounds` rounds, every layout once a round in turn; each row gives the
   median rate and the median of its rounds' ratios to the wrapper path's env-only rate.
3. **End to end**: `rlmq up --env ENV --algo ppo` (`--config` if given, else the shipped config)
   with `--actors` actors and one learner on `--device` for `--train-s` seconds, scraped as
   `bench_scaling.py` does: env steps/s, the learner's busy fraction, the actors' credit wait,
   acting and env wait, policy lag and batch; GPU utilization sampled every second by nvidia-smi
   where there is one. Its rate ÷ the best env-only rate is the fraction of the box's env limit
   that training uses.

    python benchmarks/bench_atari.py --window-s 6 --train-s 60
    python benchmarks/bench_atari.py --actors 4 --num-envs 16 --device cuda --config benchmarks/ppo-pong-gpu.toml
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_scaling

from rlmq.common.service import cores_given, limit_threads

Make = Callable[..., Callable[[float], dict[str, float]]]  # (its arguments) → run(seconds) → figures


def env_only(path: str, env_id: str, num_envs: int, threads: int) -> Callable[[float], dict[str, float]]:
    import numpy as np  # here, not at the top: after `child` limited the threads of its pools

    from rlmq.common import envs

    env = envs.make_vector_env(env_id, num_envs, threads=threads, native=path != "wrapper")
    env.reset(seed=os.getpid())
    rng = np.random.default_rng(0)
    actions = env.single_action_space.n

    def run(seconds: float) -> dict[str, float]:
        steps, deadline = 0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            env.step(rng.integers(0, actions, num_envs))
            steps += num_envs
        return {"steps": steps}

    return run


def acting(
    path: str, env_id: str, num_envs: int, device: str | None, threads: int = 1
) -> Callable[[float], dict[str, float]]:
    import numpy as np

    from rlmq.actors.collector import Collector
    from rlmq.cli.shipped import pick
    from rlmq.common import envs
    from rlmq.common.config import RunConfig
    from rlmq.common.loading import load_run_config
    from rlmq.common.models import make_policy
    from rlmq.learners.networks import ActorCritic

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.helpers: the references
    from tests.helpers.references import to_numpy_params

    shipped = pick(env_id, "ppo")
    run = load_run_config(shipped.path, {"env_id": env_id}) if shipped else RunConfig(env_id=env_id)
    spec = envs.probe(env_id)
    params = to_numpy_params(
        ActorCritic(spec, run.hidden_sizes, encoder=run.encoder_for(spec), activation=run.ppo.activation)
    )
    policy = make_policy(run, params, spec, device=device)
    if path == "wrapper":
        lanes = [envs.make_vector_env(env_id, num_envs, native=False)]
    else:
        lanes = envs.make_lanes(env_id, num_envs, threads, split=path == "native")
    collector = Collector(lanes, spec, run.rollout_length, seed=os.getpid())

    def run_for(seconds: float) -> dict[str, float]:
        steps, deadline = 0, time.perf_counter() + seconds
        collector.take_times()
        while time.perf_counter() < deadline:
            steps += int(np.count_nonzero(collector.collect(policy, 0, 0, "bench").valid))
        acting_s, env_wait_s = collector.take_times()
        return {"steps": steps, "acting_s": acting_s, "env_wait_s": env_wait_s}

    return run_for


def child(make: Make, make_args: tuple[Any, ...], warmup_s: float, window_s: float, barrier: Any, out: Any) -> None:
    limit_threads(1)
    run = make(*make_args)
    run(warmup_s)
    barrier.wait()
    started = time.perf_counter()
    result = run(window_s)
    out.put({**result, "wall_s": time.perf_counter() - started})


def together(make: Make, args_each: list[tuple[Any, ...]], warmup_s: float, window_s: float) -> dict[str, float]:
    """Run one process per entry of `args_each` at once; their summed env steps per second, and the
    fractions of their time spent acting and waiting for envs."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(len(args_each)), ctx.Queue()
    procs = [ctx.Process(target=child, args=(make, a, warmup_s, window_s, barrier, out)) for a in args_each]
    for p in procs:
        p.start()
    results: list[dict[str, float]] = []
    deadline = time.monotonic() + warmup_s + window_s + 120  # start-up included
    while len(results) < len(procs):
        try:
            results.append(out.get(timeout=1.0))
        except queue.Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:  # the others wait at the barrier for it: end them
                for p in procs:
                    p.terminate()
                    p.join()
                raise RuntimeError(f"{make.__name__}{args_each[0]}: exit codes {failed or 'none (too slow)'}") from None
    for p in procs:
        p.join()
    wall = sum(r["wall_s"] for r in results)
    return {
        "steps_per_s": sum(r["steps"] / r["wall_s"] for r in results),
        "acting": sum(r.get("acting_s", 0.0) for r in results) / wall,
        "env_wait": sum(r.get("env_wait_s", 0.0) for r in results) / wall,
    }


class GpuSampler(threading.Thread):
    """GPU utilization (%) every second from nvidia-smi, while a run trains."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[float] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(1.0):
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                    check=True,
                ).stdout
                self.samples.append(float(out.split()[0]))
            except (OSError, subprocess.SubprocessError, ValueError, IndexError):
                pass


def end_to_end(args: argparse.Namespace, gpu: bool) -> dict[str, object]:
    run_dir = args.out_dir / "train"
    up = argparse.Namespace(
        env=args.env,
        algo="ppo",
        seed=args.seed,
        total_steps=args.total_steps,
        target_return=args.target_return,
        config=args.config,
        timeout_s=args.train_s,
        scrape_s=1.0,
        up_args=["--actor-device", args.actor_device],
    )
    sampler = GpuSampler() if gpu else None
    if sampler:
        sampler.start()
    cell = bench_scaling.run_cell(up, args.actors, 1, args.device, run_dir)
    if sampler:
        sampler.halt.set()
        cell["gpu_util_mean"] = statistics.mean(sampler.samples) if sampler.samples else float("nan")
        cell["gpu_util_max"] = max(sampler.samples, default=float("nan"))
    return cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="ALE/Pong-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--cores", type=int, default=cores_given())
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--window-s", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3, help="of the env-only and acting layouts, in turn")
    parser.add_argument("--actors", type=int, default=None, help="default: --cores")
    parser.add_argument("--device", default="auto", help="the learner's")
    parser.add_argument("--actor-device", default="auto")
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-s", type=float, default=60.0, help="0: no end-to-end run")
    parser.add_argument("--total-steps", type=int, default=10_000_000)
    parser.add_argument("--target-return", type=float, default=None)
    parser.add_argument("--skip", nargs="*", default=[], choices=["env", "acting"])
    parser.add_argument("--out-dir", type=Path, default=Path("runs") / f"bench-atari-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.actors = args.actors or args.cores
    gpu = shutil.which("nvidia-smi") is not None
    cores, n = args.cores, args.num_envs
    print(f"{args.env}: {cores} cores, {n} envs a process, windows of {args.window_s} s", flush=True)
    found: dict[str, dict[str, Any]] = {}

    def row(name: str, result: dict[str, Any]) -> None:
        found[name] = result
        print(f"{name}: {json.dumps(result)}", flush=True)

    layouts: dict[str, tuple[Make, list[tuple[Any, ...]]]] = {}
    if "env" not in args.skip:
        layouts |= {
            "env wrapper": (env_only, [("wrapper", args.env, n, 1)] * cores),
            "env native": (env_only, [("native", args.env, n, 1)] * cores),
            "env native-1proc": (env_only, [("native", args.env, n * cores, cores)]),
        }
    if "acting" not in args.skip:
        layouts |= {
            "acting wrapper, CNN on the CPU": (acting, [("wrapper", args.env, n, None)] * cores),
            "acting native, one lane, CNN on the CPU": (acting, [("native-1lane", args.env, n, None)] * cores),
            "acting native, two lanes, CNN on the CPU": (acting, [("native", args.env, n, None)] * cores),
            "acting native, two lanes, 2 cores each, CNN on the CPU": (
                acting,
                [("native", args.env, 2 * n, None, 2)] * (cores // 2),
            ),
        }
        if gpu:
            layouts["acting native, two lanes, CNN on the GPU"] = (acting, [("native", args.env, n, "cuda")] * cores)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in layouts}
    for i in range(args.rounds):  # the layouts in turn, so that a drifting host drifts for all of them
        for name, (make, each) in list(layouts.items()):
            try:
                if each:
                    results[name].append(together(make, each, args.warmup_s, args.window_s))
            except RuntimeError as exc:  # left out from here on; the rest go on
                print(f"{name}: {exc}", flush=True)
                del layouts[name]
        print(
            f"round {i}: " + ", ".join(f"{name} {r[-1]['steps_per_s']:,.0f}" for name, r in results.items() if r),
            flush=True,
        )
    baseline = results.get("env wrapper", [])
    for name, rounds in results.items():
        if not rounds:
            continue
        rates = [r["steps_per_s"] for r in rounds]
        result: dict[str, Any] = {"steps_per_s": statistics.median(rates), "rounds": rates}  # fewer if it failed
        if baseline:  # each round's ratio to the wrapper path's env-only rate in that round
            ratios = [rate / base["steps_per_s"] for rate, base in zip(rates, baseline, strict=False)]
            result["ratio_median"] = statistics.median(ratios)
        if name.startswith("acting"):
            result |= {key: statistics.median(r[key] for r in rounds) for key in ("acting", "env_wait")}
        row(name, result)
    if args.train_s > 0:
        row("end to end", end_to_end(args, gpu))

    def rate(name: str) -> float:
        value = found.get(name, {}).get("steps_per_s", found.get(name, {}).get("env_steps_per_s"))
        return float(value) if isinstance(value, float | int) else float("nan")

    print("\n| measure | env steps/s | ratio |\n|:--|--:|--:|")
    wrapper = rate("env wrapper")
    limit = max(rate("env native"), rate("env native-1proc"))
    for name, result in found.items():
        extra, ratio = "", rate(name) / wrapper
        if "ratio_median" in result:  # the median of the rounds' ratios, each side by side
            ratio = float(result["ratio_median"])
        if name.startswith("acting"):
            extra = f" (acting {result['acting']:.2f}, env wait {result['env_wait']:.2f} of the time)"
        if name == "end to end":
            ratio = rate(name) / limit
        print(f"| {name}{extra} | {rate(name):,.0f} | {ratio:.3f} |")
    print(
        "\nratios: the median of the rounds' ratios to the wrapper path's env-only rate in the same round; "
        "end to end, to the best native env-only median (the box's env limit)"
    )
    if "end to end" in found:
        print(f"end to end: {json.dumps(found['end to end'])}")
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
