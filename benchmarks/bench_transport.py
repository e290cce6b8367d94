"""Experience over a Unix socket (ipc://) against loopback TCP: ZeroMQ messages per second from a
DEALER to a ROUTER, as an actor sends rollouts to a learner, with nothing else in the way.

For each message size, `--rounds` rounds alternate a `--window-s` window over loopback TCP and
one over a Unix socket; a thread of the same process receives (copy=False, as a learner does).
Prints each transport's median messages/s and MiB/s and the median of the rounds' ratios
ipc / tcp (> 1: the Unix socket is faster). Sizes: a CartPole rollout of 8 slots × 32 steps is
~4 KB on the wire, a 64 × 64 one ~100 KB, a Pong rollout of frames 8 × 128 steps ~7 MB
(RESULTS.md §10).

    python benchmarks/bench_transport.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time

import zmq

from rlmq.common import transport


def messages_per_s(endpoint: str, payload: bytes, seconds: float) -> float:
    """Send `payload` for `seconds` as fast as the socket takes it; messages received per second."""
    ctx = zmq.Context()
    router = transport.make_socket(ctx, zmq.ROUTER, hwm=1000)
    bound = transport.bind(router, endpoint)
    dealer = transport.make_socket(ctx, zmq.DEALER, hwm=1000)
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
    ctx.term()
    return counted / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4_000, 100_000, 1_000_000, 7_000_000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window-s", type=float, default=1.5)
    args = parser.parse_args()
    print("| bytes | tcp msg/s | tcp MiB/s | ipc msg/s | ipc MiB/s | ipc / tcp |\n|--:|--:|--:|--:|--:|--:|")
    with tempfile.TemporaryDirectory(prefix="rlmq-bench-") as sockets:
        for size in args.sizes:
            payload = os.urandom(size)
            rates: dict[str, list[float]] = {"tcp": [], "ipc": []}
            for r in range(args.rounds):
                rates["tcp"].append(messages_per_s("tcp://127.0.0.1:0", payload, args.window_s))
                rates["ipc"].append(messages_per_s(f"ipc://{sockets}/{size}-{r}.sock", payload, args.window_s))
            tcp, ipc = (statistics.median(v) for v in rates.values())
            ratio = statistics.median(i / t for i, t in zip(rates["ipc"], rates["tcp"], strict=True))
            mib = size / 2**20
            print(f"| {size:,} | {tcp:,.0f} | {tcp * mib:,.0f} | {ipc:,.0f} | {ipc * mib:,.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
