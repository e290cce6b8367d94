"""Experience over a Unix socket (ipc://) against loopback TCP, and what CURVE costs: ZeroMQ
messages per second from a DEALER to a ROUTER, as an actor sends rollouts to a learner, with
nothing else in the way.

For each message size, `--rounds` rounds alternate a `--window-s` window over loopback TCP, one
over a Unix socket and one over loopback TCP with CURVE (the run's keys, `common/security.py`:
authenticated at the handshake by the gatekeeper, every message encrypted); a thread of the same
process receives (copy=False, as a learner does). Prints each way's median messages/s and MiB/s
and the medians of the rounds' ratios to plain TCP (ipc > 1: the Unix socket is faster; curve < 1:
what encryption costs). Sizes: a CartPole rollout of 8 slots × 32 steps is
~4 KB on the wire, a 64 × 64 one ~100 KB, a Pong rollout of frames 8 × 128 steps ~7 MB
(benchmarks/LOG.md §10); a CartPole policy's encoded Weights are 37 KB.

    python benchmarks/bench_transport.py --rounds 5 --sizes 4000 37000 100000 1000000 7000000
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import zmq

from rlmq.common import security, transport


def messages_per_s(endpoint: str, payload: bytes, seconds: float, keys: Path | None = None) -> float:
    """Send `payload` for `seconds` as fast as the socket takes it; messages received per second.
    With `keys` (a run's key directory), over CURVE behind the gatekeeper."""
    ctx = zmq.Context()
    router = transport.make_socket(ctx, zmq.ROUTER, hwm=1000)
    dealer = transport.make_socket(ctx, zmq.DEALER, hwm=1000)
    gatekeeper = None
    if keys is not None:
        served = security.load_keys(keys, None, serves=True)
        gatekeeper = security.Gatekeeper(ctx, served.allowed, security.log_refusal)
        gatekeeper.start()
        security.serve_securely(router, served)
        security.connect_securely(dealer, security.load_keys(keys, "actor-0", serves=False))
    bound = transport.bind(router, endpoint)
    dealer.connect(bound)
    received, done = [0], threading.Event()

    def receive() -> None:
        while not done.is_set():
            if router.poll(50):
                router.recv_multipart(copy=False)
                received[0] += 1

    thread = threading.Thread(target=receive)
    thread.start()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        dealer.send(payload, copy=False)
    counted = received[0]  # what arrived within the window
    elapsed = time.perf_counter() - start
    done.set()
    thread.join()
    dealer.close(0)
    router.close(0)
    if gatekeeper is not None:
        gatekeeper.stop()
    ctx.term()
    return counted / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4_000, 100_000, 1_000_000, 7_000_000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window-s", type=float, default=1.5)
    args = parser.parse_args()
    print(
        "| bytes | tcp msg/s | tcp MiB/s | ipc msg/s | ipc / tcp | tcp + CURVE msg/s | CURVE MiB/s | CURVE / tcp |\n"
        "|--:|--:|--:|--:|--:|--:|--:|--:|"
    )
    with tempfile.TemporaryDirectory(prefix="rlmq-bench-") as scratch:
        keys = Path(scratch) / "keys"
        security.create_keys(keys, learners=0, actors=1)
        for size in args.sizes:
            payload = os.urandom(size)
            rates: dict[str, list[float]] = {"tcp": [], "ipc": [], "curve": []}
            for r in range(args.rounds):
                rates["tcp"].append(messages_per_s("tcp://127.0.0.1:0", payload, args.window_s))
                rates["ipc"].append(messages_per_s(f"ipc://{scratch}/{size}-{r}.sock", payload, args.window_s))
                rates["curve"].append(messages_per_s("tcp://127.0.0.1:0", payload, args.window_s, keys))
            tcp, ipc, curve = (statistics.median(v) for v in rates.values())
            ratio = {
                way: statistics.median(w / t for w, t in zip(rates[way], rates["tcp"], strict=True))
                for way in ("ipc", "curve")
            }
            mib = size / 2**20
            print(
                f"| {size:,} | {tcp:,.0f} | {tcp * mib:,.0f} | {ipc:,.0f} | {ratio['ipc']:.2f} | {curve:,.0f} | "
                f"{curve * mib:,.0f} | {ratio['curve']:.2f} |"
            )


if __name__ == "__main__":
    main()
