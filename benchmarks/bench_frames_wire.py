"""What a rollout of stacked Atari frames costs on the wire: the stacks as they are against each
frame once (`Rollout.frame_stack`, as actors send them; `decode` rebuilds the stacks).

One real rollout is collected from `ALE/Pong-v5` with rlmq's preprocessing (random actions,
`--slots` × `--steps`), then for each way of sending it: its bytes, msgpack encode and decode
(`common/wire.py`, as actors and learners do) and a ZeroMQ PUSH → PULL hop over loopback TCP, the
median of `--rounds` rounds, interleaved; decode includes rebuilding the stacks. The share is the
rollout's wire cost over the time the env took to step it.

    python benchmarks/bench_frames_wire.py --rounds 9
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from rlmq.common.service import limit_threads

limit_threads(1)  # as an actor process: before NumPy loads

import numpy as np  # noqa: E402
import zmq  # noqa: E402

from rlmq.common import envs, wire  # noqa: E402


def collect(steps: int, slots: int) -> tuple[wire.Rollout, float]:
    """A Pong rollout of random actions and the seconds the env took to step it."""
    env = envs.make_vector_env("ALE/Pong-v5", slots)
    obs, _ = env.reset(seed=0)
    rows = [obs]
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(steps):
        obs, *_ = env.step(rng.integers(0, 6, slots))
        rows.append(obs)
    seconds = time.perf_counter() - start
    env.close()
    zeros = np.zeros((steps, slots), np.float32)
    rollout = wire.Rollout(
        member=0,
        policy_version=1,
        actor="bench",
        obs=np.stack(rows),
        frame_stack=4,
        actions=rng.integers(0, 6, (steps, slots)),
        logprobs=zeros,
        rewards=zeros,
        terminated=zeros.astype(bool),
        truncated=zeros.astype(bool),
        valid=~zeros.astype(bool),
    )
    return rollout, seconds


def timed(rollout: wire.Rollout, push: zmq.Socket, pull: zmq.Socket) -> tuple[int, float, float, float]:
    """(bytes, encode s, hop s, decode s) of one rollout."""
    start = time.perf_counter()
    message = wire.encode(rollout)
    encoded = time.perf_counter()
    push.send(message, copy=False)
    received = pull.recv(copy=False)
    hopped = time.perf_counter()
    wire.decode(received.buffer)
    return len(message), encoded - start, hopped - encoded, time.perf_counter() - hopped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    rollout, env_seconds = collect(args.steps, args.slots)
    ways = {"stacks": dataclasses.replace(rollout, frame_stack=1), "frames once": rollout}
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push = context.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    results: dict[str, list[tuple[int, float, float, float]]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, message in ways.items():
            results[name].append(timed(message, push, pull))
    push.close(linger=0)
    pull.close(linger=0)
    context.term()
    env_steps = args.steps * args.slots
    print(
        f"ALE/Pong-v5, {args.slots} slots × {args.steps} steps: the env took {env_seconds * 1e3:.0f} ms "
        f"({env_steps / env_seconds:.0f} env steps/s, random actions, no policy)"
    )
    for name, rows in results.items():
        size = rows[0][0]
        encode, hop, decode = (statistics.median(r[i] for r in rows) for i in (1, 2, 3))
        total = encode + hop + decode
        print(
            f"{name:>12}: {size / 2**20:6.1f} MiB ({size / env_steps / 1024:.1f} KiB per env step); "
            f"encode {encode * 1e3:.1f} ms, hop {hop * 1e3:.1f} ms, decode {decode * 1e3:.1f} ms; "
            f"{total / env_seconds:.1%} of the env's time; {size / env_seconds / 2**20:.1f} MiB/s at its rate"
        )


if __name__ == "__main__":
    main()
