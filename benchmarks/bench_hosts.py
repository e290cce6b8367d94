"""The README's several-machines run on five simulated hosts (tests/helpers/hosts.py), as
tests/test_hosts.py starts it: training time to the README config's target with delay added
between the two learner hosts, how soon a cut-off actor host trains again after the heal, and
whether a run whose learner host is cut off past the collective timeout finishes by itself.
Root only (network namespaces).

    python benchmarks/bench_hosts.py                      # 0, 1, 5 and 20 ms; a 15 s actor cut, a 60 s learner cut
    python benchmarks/bench_hosts.py --delays-ms 0 5 --rounds 3 --actor-cut-s 0 --learner-cut-s 0

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delays-ms", type=float, nargs="+", default=[0, 1, 5, 20])
    parser.add_argument("--rounds", type=int, default=1, help="runs of each delay, interleaved")
    parser.add_argument("--actor-cut-s", type=float, default=15.0, help="0: no cut")
    parser.add_argument("--learner-cut-s", type=float, default=60.0, help="0: no cut")
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
    if args.learner_cut_s > 0:
        after, reason = finishes_after_learner_cut(args.learner_cut_s, args.timeout_s)
        print(f"a learner host cut off {args.learner_cut_s:g} s: the run ended ({reason}) {after:.1f} s after the heal")


if __name__ == "__main__":
    main()
