"""The coordinator's memory through a flood of subscribers that read nothing (issue 41).

`rlmq up --actors 2 --learners 1` on CartPole (secure); once it steps, `--subscribers` SUB sockets
holding actor-0's key subscribe to every topic of the coordinator's broadcast and never read, for
`--hold-s`; then they close. Prints the coordinator's resident memory (VmRSS) before, during, and
5, 15 and 30 s after the flood: what the broadcast queues held must go back to the kernel.

    python benchmarks/bench_subscription_flood.py --subscribers 500
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlmq.common import security, transport  # noqa: E402
from tests.helpers.procs import descendants, start_up, wait_until_stepping  # noqa: E402


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscribers", type=int, default=500)
    parser.add_argument("--hold-s", type=float, default=15.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-subscription-flood-") as tmp:
        run_dir = Path(tmp) / "run"
        up = start_up(run_dir, "--actors", "2", "--learners", "1", "--total-steps", "100000000")
        try:
            wait_until_stepping(run_dir, up)
            time.sleep(3)
            ((pid, command),) = [(p, c) for p, c in descendants(up.pid).items() if "rlmq.cli coordinator" in c]
            broadcast = command.split("--broadcast-bind ")[1].split()[0]
            keys = security.load_keys(run_dir / "keys", "actor-0", serves=False)
            print(f"coordinator VmRSS before: {rss_mb(pid):.1f} MB", flush=True)
            ctx = zmq.Context()
            subscribers = []
            for _ in range(args.subscribers):
                sub = transport.make_socket(ctx, zmq.SUB)
                sub.setsockopt(zmq.SUBSCRIBE, b"")
                security.connect_securely(sub, keys)
                sub.connect(broadcast)
                subscribers.append(sub)
            time.sleep(args.hold_s)
            print(
                f"with {args.subscribers} subscribers reading nothing, after {args.hold_s:g} s: {rss_mb(pid):.1f} MB",
                flush=True,
            )
            for sub in subscribers:
                sub.close(0)
            ctx.term()
            waited = 0.0
            for after in (5.0, 15.0, 30.0):
                time.sleep(after - waited)
                waited = after
                print(f"{after:g} s after they closed: {rss_mb(pid):.1f} MB", flush=True)
        finally:
            up.send_signal(signal.SIGINT)
            up.communicate(timeout=60)


if __name__ == "__main__":
    main()
