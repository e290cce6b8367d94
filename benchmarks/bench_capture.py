"""A learner's update captured by torch.compile (`compile_update`, learners/capture.py) against
the eager update, side by side in one process on the same data.

`--algo ppo` (the default): bench_population.py's problem (CartPole-sized members, one rollout of
32 steps × 8 slots each, PPOConfig's defaults; `--pixels` for MinAtar's or Atari's CNN) and its
timers. `--algo sac|td3|dqn`: one gradient step, the config's defaults, on random transitions of
a Pendulum-sized (SAC, TD3) or CartPole-sized (DQN) problem.

Both sides start from the same weights and run the same updates in the same order. The script
prints the largest difference between their weights after the first update (float32 roundings)
and after the last (Adam's normalized steps carry a rounding in a gradient near 0 into a step of
up to the learning rate, so the two drift apart over hundreds of steps). The first captured update
includes the compilation and is timed apart (`compile s`), as is the eager side's first update;
then `--repeats` alternating rounds of `--updates` updates each, medians. On `--device cuda`,
`--mode cuda-graphs` replays each part of a gradient step as a CUDA graph of eager kernels and
`--mode reduce-overhead` of torch.compile's (issue 18's targets on an H100: ≤ 5 ms per PPO update
at P = 8, ≤ 10 ms at P = 128, ≤ 1 ms per SAC step of one member). On a CPU the figures say what
compiling costs and gains against an eager path tuned by hand.

    python benchmarks/bench_capture.py --populations 1 8
    python benchmarks/bench_capture.py --algo sac --populations 1 8 --updates 20
    python benchmarks/bench_capture.py --device cuda --mode cuda-graphs --populations 8 128
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import bench_population as bp  # sets the thread limits from --threads, before NumPy and torch load
import torch

from rlmq.common.algorithms import DQNConfig, SACConfig, TD3Config
from rlmq.common.config import COMPILE_MODES
from rlmq.common.schema import EnvSpec
from rlmq.learners import ppo
from rlmq.learners.dqn import DQN
from rlmq.learners.networks import PopulationActorCritic
from rlmq.learners.offpolicy import OffPolicy, allreduce_mean
from rlmq.learners.optim import PopulationAdam
from rlmq.learners.replay import Transitions
from rlmq.learners.sac import SAC
from rlmq.learners.td3 import TD3

# The off-policy algorithms on Pendulum- and CartPole-sized problems, their configs' defaults
# (256 × 256 networks; batches of 256, DQN's 64).
PENDULUM = EnvSpec(obs_shape=(3,), action_kind="continuous", action_dim=1, action_low=(-2.0,), action_high=(2.0,))
CARTPOLE = EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=2)
OFF_POLICY: dict[str, Callable[[int, torch.device], OffPolicy]] = {
    "sac": lambda population, device: SAC(PENDULUM, SACConfig(), population, device),
    "td3": lambda population, device: TD3(PENDULUM, TD3Config(), population, device),
    "dqn": lambda population, device: DQN(CARTPOLE, DQNConfig(), population, device),
}
Side = tuple[Callable[[], torch.Tensor], Callable[[int], None]]  # (its weights now, one update)


def ppo_side(
    population: int, problem: bp.Problem, args: argparse.Namespace, device: torch.device, captured: bool
) -> Side:
    torch.manual_seed(args.seed)  # both sides start from the same weights
    pop = PopulationActorCritic(bp.SPEC, tuple(args.hidden), population, encoder=bp.ENCODER).to(device)
    optimizer = PopulationAdam(pop.flat)
    steps = ppo.capture(args.mode, allreduce_mean) if captured else None

    def one_update(i: int) -> None:
        ppo.update(pop, pop, optimizer, *problem.inputs(i), steps)

    return lambda: pop.flat.detach(), one_update


def off_policy_side(population: int, args: argparse.Namespace, device: torch.device, captured: bool) -> Side:
    torch.manual_seed(args.seed)
    algorithm = OFF_POLICY[args.algo](population, device)
    if captured:
        algorithm.capture(args.mode)
    spec = CARTPOLE if args.algo == "dqn" else PENDULUM
    size = DQNConfig.batch_size if args.algo == "dqn" else SACConfig.batch_size
    g, shape = torch.Generator().manual_seed(args.seed), (population, size)
    batches = [
        Transitions(
            obs=torch.randn(*shape, spec.obs_size, generator=g),
            actions=(
                torch.randint(0, 2, shape, generator=g)
                if args.algo == "dqn"
                else 4 * torch.rand(*shape, 1, generator=g) - 2
            ),
            rewards=torch.randn(shape, generator=g),
            next_obs=torch.randn(*shape, spec.obs_size, generator=g),
            terminated=(torch.rand(shape, generator=g) < 0.01).float(),
            horizon=torch.ones(shape),
        )
        for _ in range(8)
    ]
    batches = [Transitions(*(t.to(device) for t in b)) for b in batches]
    hp = algorithm.hyperparams([{"learning_rate": 1e-3, "gamma": 0.99, "tau": 0.005}] * population, device)
    everyone = torch.ones(population, dtype=torch.bool, device=device)
    generator = torch.Generator(device).manual_seed(args.seed)

    def one_update(i: int) -> None:
        algorithm.step(batches[i % len(batches)], hp, everyone, everyone, allreduce_mean, generator)

    return lambda: algorithm.replicated()[0].detach(), one_update


def measure(population: int, args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    torch._dynamo.reset()
    if args.algo == "ppo":
        problem = bp.make_problem(population, args, device)
        built = {
            name: ppo_side(population, problem, args, device, name == "captured") for name in ("eager", "captured")
        }
    else:
        built = {name: off_policy_side(population, args, device, name == "captured") for name in ("eager", "captured")}
    sides = {name: run for name, (_, run) in built.items()}

    def difference() -> float:
        return float((built["eager"][0]() - built["captured"][0]()).abs().max())

    first = {name: bp.seconds_per_update(run, 1, device) for name, run in sides.items()}
    after_first = difference()
    for run in sides.values():
        bp.seconds_per_update(run, args.warmup, device)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(args.repeats):
        for name in list(sides) if r % 2 == 0 else list(reversed(sides)):
            times[name].append(bp.seconds_per_update(sides[name], args.updates, device))
        print(
            f"  P={population} [{r + 1}/{args.repeats}] eager {1e3 * times['eager'][-1]:8.3f} ms   captured "
            f"{1e3 * times['captured'][-1]:8.3f} ms",
            flush=True,
        )
    eager_ms, captured_ms = (1e3 * statistics.median(times[name]) for name in sides)
    return {
        "P": population,
        "compile_s": first["captured"],
        "eager_first_s": first["eager"],
        "eager_ms": eager_ms,
        "captured_ms": captured_ms,
        "after_first": after_first,
        "difference": difference(),
        "updates": 1 + args.warmup + args.repeats * args.updates,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--populations", type=int, nargs="+", default=[1, 8], help="population sizes P")
    parser.add_argument(
        "--algo", choices=["ppo", *OFF_POLICY], default="ppo", help="whose update (off-policy: one gradient step)"
    )
    parser.add_argument("--mode", choices=COMPILE_MODES[1:], default="default", help="torch.compile's mode")
    bp.add_problem_arguments(parser)
    args = parser.parse_args()
    bp.SPEC, bp.ENCODER = bp.SPECS[args.pixels]
    torch.set_num_threads(args.threads)
    bp.keep_freed_memory()  # as a learner process
    device = bp.pick_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} thread(s)"
    print(f"torch {torch.__version__}, {name}, {args.algo}, mode {args.mode}, {bp.ENCODER} encoder", flush=True)
    started = time.perf_counter()
    results = [measure(p, args, device) for p in args.populations]
    print(
        "\n| P | device | compile s (first captured update) | eager first update s | eager ms/update "
        "| captured ms/update | eager / captured | max abs weight difference after 1 update, after N |"
    )
    print("|--:|:--|--:|--:|--:|--:|--:|:--|")
    for r in results:
        print(
            f"| {r['P']} | {device.type} | {r['compile_s']:.1f} | {r['eager_first_s']:.3f} | {r['eager_ms']:.3f} | "
            f"{r['captured_ms']:.3f} | **{r['eager_ms'] / r['captured_ms']:.2f}** | {r['after_first']:.1e}, "
            f"{r['difference']:.1e} (N = {r['updates']}) |"
        )
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
