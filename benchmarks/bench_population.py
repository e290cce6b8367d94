"""One PPO update of a whole population: the vectorized update against the loop over members.

Measured, side by side in one process on the same data:

vectorized  `ppo.update`: one `PopulationActorCritic` holding all P members stacked in one [P, D]
            parameter (batched matmuls over the member axis) and one `PopulationAdam`; on the
            CPU its matmuls run in NumPy's OpenBLAS, as in the learner (`--cpu-matmul torch`:
            torch's MKL, the library the loop's `nn.Linear`s use);
loop        `update_each_member` (tests/helpers/references.py): the reference it is tested against, a Python loop over P
            `ActorCritic` modules, each with its own `torch.optim.Adam(lr, eps=1e-5)` and
            `clip_grad_norm_` (`--loop-adam fused`: torch's fused kernel, which `PopulationAdam`
            also runs for a single member on the CPU).

Both start from the same weights. The problem is CartPole-sized (obs 4, 2 discrete actions, 64×64
tanh MLPs) and each member's batch is one rollout of the project's defaults, T = 32 steps × B = 8
slots, random but well-formed (~95 % valid steps, some episode ends). PPOConfig() defaults (10
epochs, 1 minibatch; `--minibatches` to change), every member active, per-member learning rates
log-spaced 3e-4…3e-3, the other hyperparameters PPOConfig's. The batch, minibatch plans and
normalizers are built outside the timers; a timed update is everything `update` (or the loop)
does with them, V-trace targets included.

For each P in `--populations`: `--warmup` updates of each side, then `--repeats` rounds, each
timing `--updates` consecutive updates of one side then of the other (the order swaps every round,
so neither always runs on a warmer cache). Prints each round, then a markdown table of the median
seconds per population update of each side and the ratio loop / vectorized (target ≥ 4 at P = 8),
and the roofline: each side's FLOP/s (torch's count of one update's matmuls and convolutions)
against a large matmul's, which bounds what stacking the members can gain.
Torch and OpenBLAS run `--threads` threads (1: what each learner process uses on the 2-core
machine). OpenBLAS picks its kernels for the CPU when NumPy loads, unless OPENBLAS_CORETYPE
names them (the script prints which it runs).
On `--device cuda` the timers read after `torch.cuda.synchronize()`.

    python benchmarks/bench_population.py --populations 8 32 --repeats 5 --json runs/bench_pop.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.helpers: the references

from rlmq.common.service import keep_freed_memory, limit_threads

# As a learner process does, before NumPy loads: its OpenBLAS sizes its thread pool then.
# `--threads` is read here for that, and again by argparse.
_threads = argparse.ArgumentParser(add_help=False)
_threads.add_argument("--threads", type=int, default=1)
limit_threads(_threads.parse_known_args(sys.argv[1:])[0].threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from rlmq.common.algorithms import PPOConfig  # noqa: E402
from rlmq.common.schema import EnvSpec  # noqa: E402
from rlmq.learners import minibatching, ppo, stacked_mlp  # noqa: E402
from rlmq.learners.networks import ActorCritic, PopulationActorCritic  # noqa: E402
from rlmq.learners.optim import PopulationAdam, per_member  # noqa: E402
from tests.helpers.references import update_each_member  # noqa: E402

# The problem by `--pixels`: CartPole-v1's (none), MinAtar's 10×10×4 frames through its
# convolution, or Atari's 4×84×84 stacks through the Nature CNN.
SPECS = {
    "none": (EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=2), "mlp"),
    "minatar": (EnvSpec(obs_shape=(10, 10, 4), obs_dtype="bool", action_kind="discrete", action_dim=3), "minatar"),
    "nature": (EnvSpec(obs_shape=(4, 84, 84), obs_dtype="uint8", action_kind="discrete", action_dim=6), "nature"),
}
SPEC, ENCODER = SPECS["none"]
TARGET_RATIO, TARGET_POPULATION = 4.0, 8
Plan = list[torch.Tensor | None]
# What `update` and `update_each_member` both take after the models: batch, hp, cfg, plan,
# anneal, norm, active.
UpdateInputs = tuple[ppo.Batch, ppo.MemberHyperparams, PPOConfig, Plan, torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Result:
    population: int
    device: str
    minibatches: int
    vectorized_s: list[float]  # seconds per population update, one per round
    loop_s: list[float]

    @property
    def vectorized_median(self) -> float:
        return statistics.median(self.vectorized_s)

    @property
    def loop_median(self) -> float:
        return statistics.median(self.loop_s)

    @property
    def ratio(self) -> float:  # of medians: one slow round of either side cannot sway it
        return self.loop_median / self.vectorized_median


@dataclass
class Problem:
    """Everything one update takes that is not a model: built once, reused by both sides."""

    batch: ppo.Batch
    hp: ppo.MemberHyperparams
    cfg: PPOConfig
    plans: list[Plan]  # one per update, cycled
    anneal: torch.Tensor
    norm: torch.Tensor
    active: torch.Tensor

    def inputs(self, i: int) -> UpdateInputs:
        """The arguments both `update` and `update_each_member` take after the models, update i."""
        plan = self.plans[i % len(self.plans)]
        return self.batch, self.hp, self.cfg, plan, self.anneal, self.norm, self.active


def random_batch(population: int, steps: int, slots: int, device: torch.device, seed: int) -> ppo.Batch:
    """Well-formed rollouts: what the timing depends on is the shapes, not the values."""
    g = torch.Generator().manual_seed(seed)
    shape = (population, steps, slots)
    batch = ppo.Batch(
        obs=torch.randn(population, steps + 1, slots, SPEC.obs_size, generator=g),
        actions=torch.randint(0, SPEC.action_dim, shape, generator=g),
        behaviour_logp=-torch.rand(shape, generator=g) - 0.2,
        rewards=torch.ones(shape),
        terminated=torch.rand(shape, generator=g) < 0.03,
        truncated=torch.rand(shape, generator=g) < 0.01,
        valid=torch.rand(shape, generator=g) < 0.95,
        core_state=torch.zeros(population, 1, slots, 0),
    )
    return ppo.Batch(*(t.to(device) for t in batch))


def make_problem(population: int, args: argparse.Namespace, device: torch.device) -> Problem:
    cfg = PPOConfig(minibatches=args.minibatches)
    # Different learning rates, as PBT gives its members: the vectorized Adam takes them as one
    # [P] tensor, the loop sets each member's Adam in turn (part of what the loop costs).
    shared = {name: getattr(cfg, name) for name in ppo.MemberHyperparams._fields}
    rates = np.geomspace(3e-4, 3e-3, population) if population > 1 else [cfg.learning_rate]
    members = [{**shared, "learning_rate": float(lr)} for lr in rates]
    batch = random_batch(population, args.steps, args.slots, device, args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    samples = args.steps * args.slots
    plans = [minibatching.minibatch_plan(samples, cfg, generator) for _ in range(8)]
    plans = [[None if idx is None else idx.to(device) for idx in plan] for plan in plans]
    valid = batch.valid.flatten(1)
    return Problem(
        batch=batch,
        hp=per_member(ppo.MemberHyperparams, members, device),
        cfg=cfg,
        plans=plans,
        anneal=torch.ones(population, device=device),
        norm=ppo.loss_normalizers(valid.sum(1), cfg.minibatches, world_size=1),
        active=valid.any(1),
    )


def vectorized_side(
    population: int, problem: Problem, args: argparse.Namespace, device: torch.device
) -> tuple[Callable[[int], None], PopulationActorCritic]:
    torch.manual_seed(args.seed)
    pop = PopulationActorCritic(SPEC, tuple(args.hidden), population, encoder=ENCODER).to(device)
    optimizer = PopulationAdam(pop.flat)

    def one_update(i: int) -> None:
        ppo.update(pop, pop, optimizer, *problem.inputs(i))

    return one_update, pop


def loop_side(
    pop: PopulationActorCritic, problem: Problem, args: argparse.Namespace, device: torch.device
) -> Callable[[int], None]:
    """P ActorCritics with the vectorized side's initial weights (its members before any update)."""
    nets = []
    for m in range(pop.population):
        net = ActorCritic(SPEC, tuple(args.hidden), encoder=ENCODER)
        net.load_state_dict({k: torch.from_numpy(v) for k, v in pop.member_params(m).items()})
        nets.append(net.to(device))
    fused = args.loop_adam == "fused"
    # lr here is a placeholder: update_each_member sets each member's lr before its steps.
    adams = [torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-5, fused=fused or None) for net in nets]

    def one_update(i: int) -> None:
        update_each_member(nets, adams, *problem.inputs(i))

    return one_update


def seconds_per_update(one_update: Callable[[int], None], updates: int, device: torch.device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()  # nothing queued from before may land in this timer
    start = time.perf_counter()
    for i in range(updates):
        one_update(i)
    sync()
    return (time.perf_counter() - start) / updates


def measure(population: int, args: argparse.Namespace, device: torch.device) -> Result:
    problem = make_problem(population, args, device)
    vectorized, pop = vectorized_side(population, problem, args, device)
    loop = loop_side(pop, problem, args, device)  # built before the vectorized side trains
    sides = {"vectorized": vectorized, "loop": loop}
    for run in sides.values():
        seconds_per_update(run, args.warmup, device)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(args.repeats):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            times[name].append(seconds_per_update(sides[name], args.updates, device))
        vec, loop_s = times["vectorized"][-1], times["loop"][-1]
        print(
            f"  P={population} [{r + 1}/{args.repeats}] vectorized {1e3 * vec:8.2f} ms"
            f"   loop {1e3 * loop_s:8.2f} ms   ratio {loop_s / vec:6.2f}",
            flush=True,
        )
    return Result(population, str(device), args.minibatches, times["vectorized"], times["loop"])


def update_flops(population: int, args: argparse.Namespace, device: torch.device) -> int:
    """Floating-point operations in one population update, as torch's FlopCounterMode counts them
    (matmuls and convolutions, forward and backward) on the loop side. The vectorized side does the
    same arithmetic, but partly in NumPy's OpenBLAS on the CPU, which torch cannot see."""
    from torch.utils.flop_counter import FlopCounterMode

    problem = make_problem(population, args, device)
    _, pop = vectorized_side(population, problem, args, device)
    loop = loop_side(pop, problem, args, device)
    with FlopCounterMode(display=False) as counter:
        loop(0)
    return int(counter.get_total_flops())


def matmul_peak(device: torch.device, size: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of a large float32 matmul on this device and thread count (median of `repeats`): as
    close to the arithmetic ceiling as torch gets here, and the bound on any update's rate."""
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    rates = []
    for _ in range(repeats + 1):  # the first warms up
        rates.append(2 * size**3 / seconds_per_update(lambda _i: torch.mm(a, b), 3, device))
    return statistics.median(rates[1:])


def roofline(results: Sequence[Result], flops: dict[int, int], peak: float) -> str:
    """Each side's arithmetic rate against the matmul peak, and the ratio that peak allows: an
    update whose loop already runs near the peak cannot be made much faster by stacking members."""
    lines = [f"a 1024³ float32 matmul here: {peak / 1e9:.1f} GFLOP/s"]
    for r in results:
        f = flops[r.population]
        loop_rate, vec_rate = f / r.loop_median, f / r.vectorized_median
        lines.append(
            f"P={r.population}: {f / 1e9:.2f} GFLOP per update; loop {loop_rate / 1e9:.1f} GFLOP/s "
            f"({loop_rate / peak:.0%} of the peak), vectorized {vec_rate / 1e9:.1f} GFLOP/s; "
            f"at the peak, loop / vectorized could reach at most {peak / loop_rate:.1f}×"
        )
    return "\n".join(lines)


def table(results: Sequence[Result]) -> str:
    head = ("P", "device", "minibatches", "vectorized ms/update", "loop ms/update", "loop / vectorized", "target")
    rows = ["| " + " | ".join(head) + " |", "|--:|:--:|--:|--:|--:|--:|:--:|"]
    for r in results:
        target = f"≥ {TARGET_RATIO:g}×" if r.population == TARGET_POPULATION else "–"
        ms = f"{1e3 * r.vectorized_median:.2f}", f"{1e3 * r.loop_median:.2f}"
        cells = (str(r.population), r.device, str(r.minibatches), *ms, f"**{r.ratio:.2f}**", target)
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def verdict(results: Sequence[Result]) -> str:
    at_target = [r for r in results if r.population == TARGET_POPULATION]
    target = f"target ≥ {TARGET_RATIO:g}× at P = {TARGET_POPULATION}"
    if not at_target:
        return f"{target}: not measured (P = {TARGET_POPULATION} not in --populations)"
    ratio = at_target[0].ratio
    return f"{target}: {ratio:.2f}× — {'met' if ratio >= TARGET_RATIO else 'NOT met'}"


def write_json(path: Path, results: Sequence[Result], args: argparse.Namespace) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "torch": torch.__version__,
        "python": platform.python_version(),
        "results": [{**asdict(r), **medians(r)} for r in results],
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")


def medians(r: Result) -> dict[str, float]:
    return {
        "vectorized_median_s": r.vectorized_median,
        "loop_median_s": r.loop_median,
        "ratio": r.ratio,
    }


def blas_kernels() -> str:
    """NumPy's BLAS, its kernels and threads, as threadpoolctl (the `bench` extra) reports them."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}"
    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    return ", ".join(
        f"{i['internal_api']} {i.get('architecture')} kernels × {i['num_threads']} thread(s)" for i in blas
    )


def pick_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    return torch.device(name)


def add_problem_arguments(parser: argparse.ArgumentParser) -> None:
    """The problem's and the timers' options (bench_capture.py takes them too)."""
    parser.add_argument("--minibatches", type=int, default=PPOConfig.minibatches, help="per epoch")
    parser.add_argument("--steps", type=int, default=32, help="rollout length T per member")
    parser.add_argument("--slots", type=int, default=8, help="env slots B per member")
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64], help="hidden sizes")
    parser.add_argument("--warmup", type=int, default=3, help="untimed updates of each side first")
    parser.add_argument("--repeats", type=int, default=5, help="alternating timed rounds; medians")
    parser.add_argument("--updates", type=int, default=5, help="consecutive updates per timed round")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--pixels",
        choices=list(SPECS),
        default="none",
        help="image observations through a CNN: MinAtar's or Atari's (Nature CNN)",
    )
    parser.add_argument("--seed", type=int, default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--populations", type=int, nargs="+", default=[8, 32], help="population sizes P")
    add_problem_arguments(parser)
    parser.add_argument(
        "--loop-adam",
        choices=["plain", "fused"],
        default="plain",
        help="the loop's per-member Adam: plain (as the tests) or fused (as the learner)",
    )
    parser.add_argument(
        "--malloc",
        choices=["learner", "default"],
        default="learner",
        help="glibc malloc as the learner process sets it (keep_freed_memory) or left at its defaults",
    )
    parser.add_argument(
        "--cpu-matmul",
        choices=["numpy", "torch"],
        default="numpy",
        help="the vectorized side's matmuls on the CPU: NumPy's OpenBLAS (as the learner) or torch's MKL",
    )
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args()

    global SPEC, ENCODER
    SPEC, ENCODER = SPECS[args.pixels]
    torch.set_num_threads(args.threads)
    stacked_mlp.use_cpu_matmul(args.cpu_matmul)
    if args.malloc == "learner":  # both sides share the process, so both get it
        keep_freed_memory()
    device = pick_device(args.device)
    hidden = "×".join(map(str, args.hidden))
    print(
        f"{'CartPole' if args.pixels == 'none' else args.pixels}-sized ({SPEC.obs_shape} obs, encoder {ENCODER}, "
        f"{SPEC.action_dim} actions, {hidden}), "
        f"T={args.steps} × B={args.slots} per member, "
        f"{PPOConfig.epochs} epochs × {args.minibatches} minibatch(es), {device}, "
        f"{args.threads} thread(s), loop Adam {args.loop_adam}, malloc {args.malloc}, "
        f"CPU matmul {args.cpu_matmul} ({blas_kernels()}), "
        f"warm-up {args.warmup}, "
        f"{args.repeats} round(s) × {args.updates} update(s), torch {torch.__version__}",
        flush=True,
    )
    results = [measure(population, args, device) for population in args.populations]
    print()
    print(table(results))
    print()
    print(verdict(results))
    print()
    print(
        roofline(
            results, {r.population: update_flops(r.population, args, device) for r in results}, matmul_peak(device)
        )
    )
    if args.json is not None:
        write_json(args.json, results, args)


if __name__ == "__main__":
    main()
