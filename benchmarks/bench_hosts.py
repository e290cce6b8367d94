"""The README's several-machines run on five simulated hosts (tests/helpers/hosts.py), as
tests/test_hosts.py starts it: training time to the README config's target with delay added
between the two learner hosts, how soon a cut-off actor host trains again after the heal, how
long each learner rank goes without data when an actor is killed right after a heal, and whether
a run whose learner host is cut off past the collective timeout finishes by itself. Root only
(network namespaces).

    python benchmarks/bench_hosts.py              # all of it: delays 0, 1, 5 and 20 ms, then the faults
    python benchmarks/bench_hosts.py --delays-ms 0 5 --rounds 3 --actor-cut-s 0 --learner-cut-s 0 \
        --kill-after-heal-cut-s 0                 # the delays alone
    python benchmarks/bench_hosts.py --syncs gradients batch --delays-ms 0 5 ...   # DDP against replicas
    python benchmarks/bench_hosts.py --collectives --rounds 0 --actor-cut-s 0 ...  # what one collective costs

Training time is from the first env step to the end (the run status's `first_step_at` and
`ended_at`); each ratio is of a median to the first sync's at the first delay, measured in the
same invocation, the runs interleaved round by round.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))
import hosts  # noqa: E402  (the tests' helpers, on the path above)
from several_machines import ACTORS, HOSTS, delivered, start  # noqa: E402

from rlmq.common.algorithms import SYNC_MODES  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
COLLECTIVE_NAMES = (
    "all_reduce of 16 int64",
    "all_gather of 16 int64",
    "broadcast of 16 int64",
    "all_reduce of CartPole's gradient",
    "all_gather of CartPole's gradient",
)


class Trained(NamedTuple):
    seconds: float  # of training, from the first env step to the run's end
    env_steps: int  # the run's, at its end
    reached: bool  # the target, rather than the env-step budget
    chosen: str  # what ppo.sync "auto" chose, as rank 0 logged it ("" if it did not choose)


def train(delay_ms: float, timeout_s: float, sync: str = "") -> Trained:
    """The README's run with `delay_ms` one way between the learner hosts, the learners kept in
    step as `sync` says (a `ppo.sync`; "": the README config's)."""
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp, hosts.Hosts(HOSTS, Path(tmp)) as net:
        net.delay_between("learner-0", "learner-1", delay_ms / 1000)
        watch = start(net, REPO, ppo_sync=sync)
        try:
            end = watch.until(lambda s: s["ended_at"] is not None, timeout_s, "the run's end")
        finally:
            watch.close()
        chosen = re.search(r'ppo\.sync "auto": (.*)', (Path(tmp) / "learner-0.log").read_text())
        return Trained(
            float(end["ended_at"] - end["first_step_at"]),
            int(end["env_steps"]),
            end["reason"] == "target",
            chosen.group(1) if chosen else "",
        )


# One learner host's side of `collectives_ms`: argv rank, rank 0's address, port; rank 0 prints
# the milliseconds of each collective as JSON.
COLLECTIVES = """
import json, os, sys, time, torch, torch.distributed as dist
rank, master, port = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ["GLOO_SOCKET_IFNAME"] = "eth0"  # the host's one interface (tests/helpers/hosts.py), as a learner sets it
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=2)
flags, gradient = torch.zeros(16, dtype=torch.int64), torch.zeros(9155)  # the agreement's; CartPole's MLP
rows, parts = [torch.zeros_like(flags) for _ in range(2)], [torch.zeros_like(gradient) for _ in range(2)]
runs = {"all_reduce of 16 int64": lambda: dist.all_reduce(flags),
        "all_gather of 16 int64": lambda: dist.all_gather(rows, flags),
        "broadcast of 16 int64": lambda: dist.broadcast(flags, 0),
        "all_reduce of CartPole's gradient": lambda: dist.all_reduce(gradient),
        "all_gather of CartPole's gradient": lambda: dist.all_gather(parts, gradient)}
ms = {}
for name, run in runs.items():
    for _ in range(3):
        run()
    started = time.perf_counter()
    for _ in range(30):
        run()
    ms[name] = (time.perf_counter() - started) / 30 * 1e3
if rank == 0:
    print(json.dumps(ms))
dist.destroy_process_group()
"""


def collectives_ms(delay_ms: float) -> dict[str, float]:
    """Milliseconds of one gloo collective of two ranks on the learner hosts, `delay_ms` one way
    apart (the mean of 30, after 3 untimed)."""
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp, hosts.Hosts(HOSTS, Path(tmp)) as net:
        net.delay_between("learner-0", "learner-1", delay_ms / 1000)
        ranks = [
            net.start(
                f"learner-{rank}",
                [sys.executable, "-c", COLLECTIVES, str(rank), net.address("learner-0"), "29500"],
                f"rank{rank}.log",
            )
            for rank in range(2)
        ]
        for rank in ranks:
            rank.wait(timeout=120)
        ms: dict[str, float] = json.loads((Path(tmp) / "rank0.log").read_text().splitlines()[-1])
        return ms


def back_after_cut(cut_s: float, timeout_s: float) -> float:
    """Seconds from the heal of an actor host cut off `cut_s` until its actors' rollouts arrive.
    5 ms between the learner hosts with DDP's all-reduce per gradient step makes the run outlast
    the cut (at 0 ms, or replicated, it ends during it)."""
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp, hosts.Hosts(HOSTS, Path(tmp)) as net:
        net.delay_between("learner-0", "learner-1", 0.005)
        watch = start(net, REPO, ppo_sync="gradients")
        try:
            watch.until(lambda s: all(delivered(s, a) > 0 for a in ACTORS), timeout_s, "every actor's rollouts")
            net.cut("actors-1")
            time.sleep(cut_s)
            before = {a: delivered(watch.latest, a) for a in ACTORS[2:]}
            net.heal("actors-1")
            healed = time.monotonic()
            watch.until(lambda s: all(delivered(s, a) > before[a] for a in before), timeout_s, "the cut actors")
            return time.monotonic() - healed
        finally:
            watch.close()


def finishes_after_learner_cut(cut_s: float, timeout_s: float) -> tuple[float, str]:
    """Cut a learner host off `cut_s` once training runs; (seconds from the heal to the run's end,
    its reason). The ranks lose their world at the collective timeout and `--restart` brings them
    into a new one."""
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp, hosts.Hosts(HOSTS, Path(tmp)) as net:
        watch = start(net, REPO)
        try:
            watch.until(lambda s: all(delivered(s, a) > 0 for a in ACTORS), timeout_s, "every actor's rollouts")
            net.cut("learner-1")
            time.sleep(cut_s)
            net.heal("learner-1")
            healed = time.monotonic()
            end = watch.until(lambda s: s["state"] == "done", timeout_s, "the run's end")
            return time.monotonic() - healed, str(end["reason"])
        finally:
            watch.close()


def longest_wait(lines: list[dict[str, Any]], rank: str, start: float, end: float) -> float:
    """The longest time within [start, end] (unix seconds) in which no rollout reached the rank
    (its received env steps did not grow), to the watch's poll (tests/helpers/watch_run.py)."""
    grew = [start]
    last = None
    for line in lines:
        value = line["received"].get(rank)
        if value is not None and last is not None and value > last and start <= line["time"] <= end:
            grew.append(line["time"])
        last = value if value is not None else last
    grew.append(end)
    return max(b - a for a, b in zip(grew, grew[1:], strict=False))


def kill_after_heal(cut_s: float, timeout_s: float) -> tuple[dict[str, float], dict[str, float]]:
    """An actor host cut off `cut_s`; once its actor-2 trains again after the heal (so it holds a
    credit granted after the partition), actor-2 is killed. Each rank's longest wait for data in
    the 10 s before the cut and in the 10 s after the kill."""
    window = 10.0
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp, hosts.Hosts(HOSTS, Path(tmp)) as net:
        net.delay_between("learner-0", "learner-1", 0.005)  # with DDP, a run that outlasts it all
        watch = start(net, REPO, received=True, ppo_sync="gradients")
        try:
            watch.until(lambda s: all(delivered(s, a) > 0 for a in ACTORS), timeout_s, "every actor's rollouts")
            time.sleep(window)
            cut_at = time.time()
            net.cut("actors-1")
            time.sleep(cut_s)
            before = delivered(watch.latest, "actor-2")
            net.heal("actors-1")
            watch.until(lambda s: delivered(s, "actor-2") > before, timeout_s, "actor-2 back")
            watch.actors["actor-2"].kill()
            killed_at = time.time()
            time.sleep(window)
            assert watch.latest["state"] == "running", "the run ended: make it longer"
            lines = list(watch.lines)
        finally:
            watch.close()
    ranks = sorted(lines[-1]["received"])
    return (
        {r: longest_wait(lines, r, cut_at - window, cut_at) for r in ranks},
        {r: longest_wait(lines, r, killed_at, killed_at + window) for r in ranks},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delays-ms", type=float, nargs="+", default=[0, 1, 5, 20])
    parser.add_argument("--rounds", type=int, default=1, help="runs of each delay, interleaved; 0: no runs")
    parser.add_argument(
        "--collectives",
        action="store_true",
        help="first, each gloo collective's time between the learner hosts at each delay",
    )
    parser.add_argument(
        "--syncs",
        nargs="+",
        default=[""],
        choices=["", *SYNC_MODES],
        help='ppo.sync values to compare ("": the README config\'s)',
    )
    parser.add_argument("--actor-cut-s", type=float, default=15.0, help="0: no cut")
    parser.add_argument("--learner-cut-s", type=float, default=60.0, help="0: no cut")
    parser.add_argument(
        "--kill-after-heal-cut-s",
        type=float,
        default=15.0,
        help="an actor host cut off this long, then one of its actors killed once back; 0: not run",
    )
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args()
    # A SIGTERM unwinds the `with Hosts(...)` blocks as Ctrl-C does, so no service outlives the bench.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if (why := hosts.why_not()) is not None:
        sys.exit(f"bench_hosts: {why}")
    if args.collectives:
        print("| one-way delay between learner hosts | " + " | ".join(COLLECTIVE_NAMES) + " |")
        print("|--:|" + "--:|" * len(COLLECTIVE_NAMES))
        for delay in args.delays_ms:
            ms = collectives_ms(delay)
            print(
                f"| {delay:g} ms | " + " | ".join(f"{ms[name]:.2f} ms" for name in COLLECTIVE_NAMES) + " |", flush=True
            )
    runs: dict[tuple[str, float], list[Trained]] = {(s, d): [] for s in args.syncs for d in args.delays_ms}
    for round_ in range(args.rounds):
        for sync, delay in runs:
            run = train(delay, args.timeout_s, sync)
            runs[sync, delay].append(run)
            print(
                f"round {round_}: ppo.sync {sync or 'as configured'}, {delay:g} ms one way between the learner "
                f"hosts: {run.seconds:.1f} s of training, {run.env_steps} env steps, "
                f"{'target reached' if run.reached else 'target NOT reached (budget spent)'}"
                f"{'; auto chose ' + run.chosen if run.chosen else ''}",
                flush=True,
            )
    if args.rounds > 0:

        def median_s(key: tuple[str, float]) -> float:  # of the runs that reached the target
            return statistics.median([r.seconds for r in runs[key] if r.reached] or [float("nan")])

        base = median_s((args.syncs[0], args.delays_ms[0]))
        print(
            f"\n| ppo.sync | one-way delay between learner hosts | runs that reached the target | training to it "
            f"(median) | env steps (median) | ratio to {args.syncs[0] or 'as configured'} at "
            f"{args.delays_ms[0]:g} ms |"
        )
        print("|--|--:|--:|--:|--:|--:|")
        for (sync, delay), done in runs.items():
            steps = statistics.median([r.env_steps for r in done if r.reached] or [0])
            print(
                f"| {sync or 'as configured'} | {delay:g} ms | {sum(r.reached for r in done)} of {len(done)} "
                f"| {median_s((sync, delay)):.1f} s | {steps:,.0f} | {median_s((sync, delay)) / base:.2f} |"
            )
    if args.actor_cut_s > 0:
        back = back_after_cut(args.actor_cut_s, args.timeout_s)
        print(
            f"\nan actor host cut off {args.actor_cut_s:g} s: its actors' rollouts arrive {back:.2f} s after the heal"
        )
    if args.kill_after_heal_cut_s > 0:
        before, after = kill_after_heal(args.kill_after_heal_cut_s, args.timeout_s)
        print(
            f"an actor killed right after a {args.kill_after_heal_cut_s:g} s cut's heal: each rank's longest "
            f"wait for data, 10 s before the cut {before}, 10 s after the kill {after}"
        )
    if args.learner_cut_s > 0:
        ended_s, reason = finishes_after_learner_cut(args.learner_cut_s, args.timeout_s)
        print(
            f"a learner host cut off {args.learner_cut_s:g} s: the run ended ({reason}) {ended_s:.1f} s after the heal"
        )


if __name__ == "__main__":
    main()
