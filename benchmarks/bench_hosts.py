"""The README's several-machines run on five simulated hosts (tests/helpers/hosts.py), as
tests/test_hosts.py starts it: training time to the README config's target with delay added
between the two learner hosts, how soon a cut-off actor host trains again after the heal, how
long each learner rank goes without data when an actor is killed right after a heal, and whether
a run whose learner host is cut off past the collective timeout finishes by itself. Root only
(network namespaces).

    python benchmarks/bench_hosts.py              # all of it: delays 0, 1, 5 and 20 ms, then the faults
    python benchmarks/bench_hosts.py --delays-ms 0 5 --rounds 3 --actor-cut-s 0 --learner-cut-s 0 \
        --kill-after-heal-cut-s 0                 # the delays alone

Training time is from the first env step to the end (the run status's `first_step_at` and
`ended_at`); each delay's ratio is of its median to the first delay's, measured in the same
invocation, the delays interleaved round by round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))
import hosts  # noqa: E402  (the tests' helpers, on the path above)
from several_machines import ACTORS, HOSTS, delivered, start  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def train_s(delay_ms: float, timeout_s: float) -> float:
    """Seconds of training to the target with `delay_ms` one way between the learner hosts."""
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp, hosts.Hosts(HOSTS, Path(tmp)) as net:
        net.delay_between("learner-0", "learner-1", delay_ms / 1000)
        watch = start(net, REPO)
        try:
            end = watch.until(lambda s: s["ended_at"] is not None, timeout_s, "the run's end")
        finally:
            watch.close()
        if end["reason"] != "target":
            raise RuntimeError(f"the run ended without its target: {end}")
        return float(end["ended_at"] - end["first_step_at"])


def back_after_cut(cut_s: float, timeout_s: float) -> float:
    """Seconds from the heal of an actor host cut off `cut_s` until its actors' rollouts arrive.
    5 ms between the learner hosts makes the run outlast the cut (at 0 ms it ends during it)."""
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp, hosts.Hosts(HOSTS, Path(tmp)) as net:
        net.delay_between("learner-0", "learner-1", 0.005)
        watch = start(net, REPO)
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
    """The longest time within [start, end] (unix seconds) in which the rank's trained env steps
    did not grow: how long it went without data (a rank trains only on data of its own)."""
    grew = [start]
    last = None
    for line in lines:
        value = line["trained"].get(rank)
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
        net.delay_between("learner-0", "learner-1", 0.005)  # a run that outlasts it all
        watch = start(net, REPO, trained=True)
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
    ranks = sorted(lines[-1]["trained"])
    return ({r: longest_wait(lines, r, cut_at - window, cut_at) for r in ranks},
            {r: longest_wait(lines, r, killed_at, killed_at + window) for r in ranks})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delays-ms", type=float, nargs="+", default=[0, 1, 5, 20])
    parser.add_argument("--rounds", type=int, default=1, help="runs of each delay, interleaved")
    parser.add_argument("--actor-cut-s", type=float, default=15.0, help="0: no cut")
    parser.add_argument("--learner-cut-s", type=float, default=60.0, help="0: no cut")
    parser.add_argument("--kill-after-heal-cut-s", type=float, default=15.0,
                        help="an actor host cut off this long, then one of its actors killed once back; 0: not run")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args()
    if (why := hosts.why_not()) is not None:
        sys.exit(f"bench_hosts: {why}")
    times: dict[float, list[float]] = {d: [] for d in args.delays_ms}
    for round_ in range(args.rounds):
        for delay in args.delays_ms:
            times[delay].append(train_s(delay, args.timeout_s))
            print(f"round {round_}: {delay:g} ms one way between the learner hosts: {times[delay][-1]:.1f} s of "
                  "training to the target", flush=True)
    base = statistics.median(times[args.delays_ms[0]])
    print(f"\n| one-way delay between learner hosts | training to the target (median of {args.rounds}) | ratio |")
    print("|--:|--:|--:|")
    for delay, seconds in times.items():
        print(f"| {delay:g} ms | {statistics.median(seconds):.1f} s | {statistics.median(seconds) / base:.2f} |")
    if args.actor_cut_s > 0:
        back = back_after_cut(args.actor_cut_s, args.timeout_s)
        print(f"\nan actor host cut off {args.actor_cut_s:g} s: its actors' rollouts arrive {back:.2f} s "
              "after the heal")
    if args.kill_after_heal_cut_s > 0:
        before, after = kill_after_heal(args.kill_after_heal_cut_s, args.timeout_s)
        print(f"an actor killed right after a {args.kill_after_heal_cut_s:g} s cut's heal: each rank's longest "
              f"wait for data, 10 s before the cut {before}, 10 s after the kill {after}")
    if args.learner_cut_s > 0:
        after, reason = finishes_after_learner_cut(args.learner_cut_s, args.timeout_s)
        print(f"a learner host cut off {args.learner_cut_s:g} s: the run ended ({reason}) {after:.1f} s after the heal")


if __name__ == "__main__":
    main()
