"""Learner ingest: the rollouts per second a learner accepts (and trains on) from synthetic actors
at full speed, against what ZeroMQ and msgpack alone carry of the same messages.

`--actors` synthetic actor processes (this script with `--actor`) speak the real protocol to one
experience socket: a `Hello`, then one pre-encoded `Rollout` for every `Credit` that arrives
(`Weights` messages are read and dropped), with no env and no policy, so they send as fast as
they are let. Three receivers take turns, `--rounds` rounds of `--window-s` each:

    raw      a ROUTER that msgpack-unpacks each message (no validation) and answers each with a
             pre-encoded `Credit`: the transport's and the codec's rate for these messages;
    ingest   a real `Learner` (learners/learner.py): `receive` (decode and validate every message,
             credits by its ledger, the queue), then every queued rollout taken and dropped;
    train    the same, with the PPO trainer's update on what was taken (`--device`).

Each actor holds at most one credit, as against a learner. Prints rollouts/s and env steps/s of
each (medians of the rounds) and ingest / raw (the issue's target: ≥ 0.8) and train / raw; then
the same per second of the receiving process's CPU time (`time.process_time`), which leaves out
the waits for the actors' round trips: what ingest costs, where the wall rates say what a
credit-paced fleet of this size gets.

    python benchmarks/bench_ingest.py --actors 4 --slots 8 --steps 32
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import msgpack
import numpy as np
import torch
import zmq

from rlmq.common import transport, wire
from rlmq.common.algorithms import PPOConfig
from rlmq.common.config import LearnerConfig, RunConfig
from rlmq.common.schema import EnvSpec, allocate
from rlmq.common.service import StopFlag
from rlmq.learners.credits import CreditTimeouts
from rlmq.learners.learner import Learner
from rlmq.learners.members import MemberQueues
from rlmq.learners.trainers import make_trainer

SPEC = EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=2)  # CartPole's


def encoded_rollout(slots: int, steps: int) -> bytes:
    arrays = allocate(SPEC, steps, slots, zeros=True)
    rng = np.random.default_rng(0)
    arrays["obs"][:] = rng.standard_normal(arrays["obs"].shape)
    arrays["actions"][:] = rng.integers(0, 2, arrays["actions"].shape)
    arrays["logprobs"][:] = np.log(0.5)
    arrays["rewards"][:] = 1.0
    arrays["valid"][:] = True
    return wire.encode(wire.Rollout(member=0, policy_version=0, actor="synthetic", **arrays))


def synthetic_actor(endpoint: str, name: str, slots: int, steps: int, seconds: float) -> None:
    """One rollout for every credit, for `seconds`; a `Hello` first and again while it holds none."""
    encoded = encoded_rollout(slots, steps)
    hello = wire.encode(wire.Hello(role="actor", name=name, pid=os.getpid(), member=0))
    ctx = zmq.Context()
    sock = transport.make_socket(ctx, zmq.DEALER, identity=name.encode())
    sock.connect(endpoint)
    deadline, asked = time.monotonic() + seconds, 0.0
    while time.monotonic() < deadline:
        if time.monotonic() - asked > wire.CREDIT_REQUEST_RENEW_S:
            sock.send(hello)
            asked = time.monotonic()
        if sock.poll(50):
            if isinstance(wire.decode(sock.recv()), wire.Credit):
                sock.send(encoded, copy=False)
                asked = time.monotonic()  # holding none again, it asks by sending: the next Hello waits
    sock.close(0)
    ctx.term()


def start_actors(endpoint: str, args: argparse.Namespace, seconds: float) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--actor",
                endpoint,
                f"synthetic-{i}",
                str(args.slots),
                str(args.steps),
                str(seconds),
            ]
        )
        for i in range(args.actors)
    ]


Rate = tuple[float, float]  # (rollouts per second of wall time, per second of the receiver's CPU time)


def raw_rate(args: argparse.Namespace) -> Rate:
    """Rollouts/s through a ROUTER that only unpacks them and answers each with a credit."""
    ctx = zmq.Context()
    router = transport.make_socket(ctx, zmq.ROUTER, hwm=1000)
    endpoint = transport.bind(router, "tcp://127.0.0.1:0")
    credit = wire.encode(wire.Credit(1, policy_version=0))
    actors = start_actors(endpoint, args, args.window_s + 2)
    rollouts, started, deadline, cpu = 0, 0.0, 0.0, 0.0
    while not started or time.monotonic() < deadline:
        if not router.poll(100):
            continue
        actor, encoded = router.recv_multipart(copy=False)
        top = msgpack.unpackb(encoded.buffer, raw=False)
        if top[1] == "Rollout":
            if not started:  # the window opens with the first rollout: the actors' start-up stays out
                started, deadline, cpu = time.monotonic(), time.monotonic() + args.window_s, time.process_time()
            else:
                rollouts += 1
        router.send_multipart([actor.bytes, credit])
    rate = rollouts / (time.monotonic() - started), rollouts / (time.process_time() - cpu)
    for actor_process in actors:
        actor_process.wait()
    router.close(0)
    ctx.term()
    return rate


def learner_rate(args: argparse.Namespace, train: bool) -> Rate:
    """Rollouts/s a real learner receives, validates and queues (and, with `train`, trains on)."""
    cfg = LearnerConfig(
        run="ingest",
        coordinator="tcp://127.0.0.1:9",
        broadcast="tcp://127.0.0.1:9",
        metrics_port=-1,
        bind_host="127.0.0.1",
        advertise_host="127.0.0.1",
        experience_port=0,
        device=args.device,
    )
    learner = Learner(cfg, StopFlag())
    run_config = RunConfig(
        num_envs=args.slots,
        rollout_length=args.steps,
        rollouts_in_flight=args.actors,
        ppo=PPOConfig(max_rollouts_per_batch=args.actors),
    )
    learner.run_config, learner.spec = run_config, SPEC
    learner.members = MemberQueues(1, args.actors, CreditTimeouts(), 1, 2**62, 0.0, 0.0, most_per_batch=args.actors)
    # (what a credit is sent behind, once per actor and version: the version never moves here)
    learner.credit_messages.weights[0] = (
        0,
        wire.encode(wire.Weights(member=0, version=0, params={"w": np.zeros(1, np.float32)})),
    )
    trainer = make_trainer(SPEC, run_config, (), 0, 1, torch.device(args.device)) if train else None
    if trainer is not None:
        trainer.set_hyperparams([run_config.base_hyperparams()])
    actors = start_actors(learner.sockets.endpoint, args, args.window_s + 2)
    rollouts, started, deadline, cpu = 0, 0.0, 0.0, 0.0
    while not started or time.monotonic() < deadline:
        learner.receive(timeout_ms=10)
        sizes = learner.members.batch_sizes()
        if not sizes[0]:
            continue
        samples = learner.members.batch_samples()
        taken = learner.members.take()
        if not started:
            started, deadline, cpu = time.monotonic(), time.monotonic() + args.window_s, time.process_time()
        else:
            rollouts += sizes[0]
        if trainer is not None:
            trainer.train(taken.rollouts, samples, sizes[0])
    rate = rollouts / (time.monotonic() - started), rollouts / (time.process_time() - cpu)
    for actor_process in actors:
        actor_process.wait()
    learner.close()
    return rate


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--actor":
        endpoint, name, slots, steps, seconds = sys.argv[2:7]
        synthetic_actor(endpoint, name, int(slots), int(steps), float(seconds))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=5.0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    message_bytes = len(encoded_rollout(args.slots, args.steps))
    rates: dict[str, list[Rate]] = {"raw": [], "ingest": [], "train": []}
    for _ in range(args.rounds):
        rates["raw"].append(raw_rate(args))
        rates["ingest"].append(learner_rate(args, train=False))
        rates["train"].append(learner_rate(args, train=True))
    per_rollout = args.slots * args.steps
    print(
        f"{args.actors} synthetic actors, rollouts of {args.slots} × {args.steps} CartPole steps "
        f"({message_bytes:,} bytes), learner on {args.device}, {args.rounds} rounds of {args.window_s} s\n"
    )
    print("| receiver | rollouts/s | env steps/s | / raw | rollouts per CPU s | / raw |\n|:--|--:|--:|--:|--:|--:|")
    for name, values in rates.items():
        cells = []
        for i in (0, 1):  # wall, then the receiver's CPU time; ratios: medians of the rounds'
            median = statistics.median(v[i] for v in values)
            ratio = statistics.median(v[i] / r[i] for v, r in zip(values, rates["raw"], strict=True))
            cells += (
                [f"{median:,.0f}", f"{median * per_rollout:,.0f}", f"{ratio:.2f}"]
                if i == 0
                else [f"{median:,.0f}", f"{ratio:.2f}"]
            )
        print(f"| {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
