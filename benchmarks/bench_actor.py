"""One actor's env-steps/s against the bare env-plus-policy loop it is built around.

Measured, one after the other so that they never share a core:

1. the bare loop, in a child process: `make_vector_env("CartPole-v1", N)` (CartPole's native
   vector env), then `NumpyPolicy.act` and `env.step` on every step, nothing else;
2. the real actor, `python -m rlmq.cli actor ...` in a child process, talking over real ZeroMQ
   sockets to peers this script runs: a stand-in coordinator (ROUTER that answers the actor's
   `Hello` with an `Assign` carrying the run config and initial weights, and ignores its reports),
   a PUB socket at the broadcast endpoint (silent), and a sink that plays a learner (ROUTER that
   grants `--credits` credits on the actor's Hello and one more per rollout, so the actor never
   waits, and decodes every rollout with `wire.decode` as a learner would).

Both use the same weights (a fresh `ActorCritic(spec, (64, 64))`) and count the same thing: valid
env steps (`Rollout.valid`: the step a next-step autoreset spends resetting a slot is not counted),
in a window of `--window-s` seconds after `--warmup-s` seconds of warm-up (for the actor, counted
from its first rollout, so its start-up is excluded). Children run with OMP/OPENBLAS/MKL threads=1;
`--cpu K` pins both measured loops to core K (the peers stay unpinned: give them another core).
`--repeats` alternates bare and actor runs to average out a noisy host; prints each pair, then the
median bare steps/s, median actor steps/s and their ratio actor / bare (target ≥ 0.9).

    python benchmarks/bench_actor.py --num-envs 64 --warmup-s 2 --window-s 10 --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np
import zmq

from rlmq.common import envs, transport, wire
from rlmq.common.config import EnvSpec, RunConfig
from rlmq.common.models import NumpyPolicy

ENV_ID = "CartPole-v1"
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class Rate:
    valid_steps: int  # env steps counted in the window (autoreset steps excluded)
    slot_steps: int  # every slot-step in the window (num_envs per vector step)
    seconds: float

    @property
    def valid_per_s(self) -> float:
        return self.valid_steps / self.seconds

    @property
    def slot_per_s(self) -> float:
        return self.slot_steps / self.seconds


def initial_params(spec: EnvSpec, hidden: tuple[int, ...], seed: int) -> wire.Params:
    """Weights of a fresh learner network, as the learner would publish them (torch only here)."""
    import torch

    from rlmq.learners.networks import ActorCritic, to_numpy_params

    torch.manual_seed(seed)
    return to_numpy_params(ActorCritic(spec, hidden))


# --- (1) the bare loop ------------------------------------------------------------------------


def bare_loop(params: wire.Params, num_envs: int, warmup_s: float, window_s: float, seed: int) -> Rate:
    env = envs.make_vector_env(ENV_ID, num_envs)
    policy = NumpyPolicy(params, envs.describe(env, ENV_ID))
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    prev_done = np.zeros(num_envs, dtype=bool)
    start = time.perf_counter()
    window_start = start + warmup_s
    end = window_start + window_s
    counting, valid, slots, now = False, 0, 0, start
    while now < end:
        actions, _logp = policy.act(obs, rng)
        obs, _reward, term, trunc, _ = env.step(actions)
        if counting:
            valid += num_envs - int(np.count_nonzero(prev_done))
            slots += num_envs
        prev_done = term | trunc
        now = time.perf_counter()
        if not counting and now >= window_start:
            counting, window_start = True, now
    env.close()
    return Rate(valid, slots, now - window_start)


def pin(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def _bare_child(conn: Connection, cpu: int | None, *args: object) -> None:
    pin(cpu)  # the parent is not pinned: it runs the peers
    conn.send(bare_loop(*args))  # type: ignore[arg-type]
    conn.close()


def run_bare(params: wire.Params, args: argparse.Namespace) -> Rate:
    """The bare loop in a fresh interpreter (spawn): no torch loaded, same thread limits."""
    ctx = mp.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_bare_child, args=(sender, args.cpu, params, args.num_envs,
                                                  args.warmup_s, args.window_s, args.seed))
    child.start()
    sender.close()
    rate: Rate = receiver.recv()
    child.join()
    return rate


# --- (2) the real actor against stand-in peers ------------------------------------------------


class Peers:
    """Coordinator stand-in, silent broadcast and a learner-like sink, on one ZeroMQ context."""

    def __init__(self, assign: wire.Assign, credits: int) -> None:
        ctx: zmq.Context = zmq.Context.instance()
        self.control = transport.make_socket(ctx, zmq.ROUTER, hwm=1000)
        self.broadcast = transport.make_socket(ctx, zmq.PUB, hwm=100)
        self.sink = transport.make_socket(ctx, zmq.ROUTER, hwm=1000)
        self.control_endpoint = transport.bind(self.control, "tcp://127.0.0.1:0")
        self.broadcast_endpoint = transport.bind(self.broadcast, "tcp://127.0.0.1:0")
        self.sink_endpoint = transport.bind(self.sink, "tcp://127.0.0.1:0")
        self.assign_frame = wire.encode(dataclasses.replace(assign, learner_endpoints=(self.sink_endpoint,)))
        self.hello_credit = wire.encode(wire.Credit(credits))
        self.credit = wire.encode(wire.Credit(1))
        self.first_rollout_at: float | None = None
        self.arrivals: list[tuple[float, int, int]] = []  # (time, valid steps, slot steps)
        self.rejected = 0
        self.poller = zmq.Poller()
        self.poller.register(self.control, zmq.POLLIN)
        self.poller.register(self.sink, zmq.POLLIN)

    def serve(self, until: float) -> None:
        while (now := time.perf_counter()) < until:
            ready = dict(self.poller.poll(max(int((until - now) * 1000), 1)))
            if self.control in ready:
                self.on_control()
            if self.sink in ready:
                self.on_sink()

    def on_control(self) -> None:
        while self.control.poll(0, zmq.POLLIN):
            identity, frame = self.control.recv_multipart()
            try:
                if isinstance(wire.decode(frame), wire.Hello):  # ActorReports are ignored
                    self.control.send_multipart([identity, self.assign_frame])
            except wire.WireError:
                self.rejected += 1

    def on_sink(self) -> None:
        """What `Learner.receive` does, less the queue: decode, check, count, grant a credit."""
        while self.sink.poll(0, zmq.POLLIN):
            identity, frame = self.sink.recv_multipart(copy=False)
            try:
                message = wire.decode(frame.buffer)
            except wire.WireError:
                self.rejected += 1
                continue
            if isinstance(message, wire.Hello):
                self.sink.send_multipart([identity.bytes, self.hello_credit])
            elif isinstance(message, wire.Rollout):
                now = time.perf_counter()
                self.first_rollout_at = self.first_rollout_at or now
                self.arrivals.append((now, int(message.valid.sum()), message.valid.size))
                self.sink.send_multipart([identity.bytes, self.credit])

    def close(self) -> None:
        for sock in (self.control, self.broadcast, self.sink):
            sock.close()


def run_actor(assign: wire.Assign, args: argparse.Namespace, child_env: dict[str, str]) -> Rate:
    peers = Peers(assign, args.credits)
    argv = [sys.executable, "-m", "rlmq.cli", "actor", "--name", "actor-0",
            "--coordinator", peers.control_endpoint, "--broadcast", peers.broadcast_endpoint,
            "--metrics-port", "-1"]  # fmt: skip
    actor = subprocess.Popen(argv, env=child_env, stdin=subprocess.DEVNULL, preexec_fn=lambda: pin(args.cpu))
    try:
        deadline = time.perf_counter() + args.startup_timeout_s
        while peers.first_rollout_at is None:
            if actor.poll() is not None or time.perf_counter() > deadline:
                raise RuntimeError(f"no rollout within {args.startup_timeout_s} s (actor exit code {actor.poll()})")
            peers.serve(time.perf_counter() + 0.1)
        window_start = peers.first_rollout_at + args.warmup_s
        window_end = window_start + args.window_s
        peers.serve(window_end)
        if actor.poll() is not None:
            raise RuntimeError(f"the actor exited with {actor.returncode} during the window")
    finally:
        peers.broadcast.send_multipart([wire.DIRECTIVE_TOPIC, wire.encode(wire.Directive("stop", "bench over"))])
        actor.terminate()
        try:
            actor.wait(10)
        except subprocess.TimeoutExpired:
            actor.kill()
            actor.wait()
        peers.close()
    if peers.rejected:
        print(f"warning: the peers dropped {peers.rejected} malformed message(s)")
    in_window = [(v, s) for t, v, s in peers.arrivals if window_start < t <= window_end]
    return Rate(sum(v for v, _ in in_window), sum(s for _, s in in_window), window_end - window_start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=64, help="vector-env slots (N)")
    parser.add_argument("--rollout-length", type=int, default=32, help="steps per rollout (T)")
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64], help="policy hidden sizes")
    parser.add_argument("--warmup-s", type=float, default=2.0, help="warm-up before the window")
    parser.add_argument("--window-s", type=float, default=10.0, help="measurement window")
    parser.add_argument("--credits", type=int, default=4, help="credits the sink keeps outstanding")
    parser.add_argument("--repeats", type=int, default=3, help="bare/actor pairs, alternating; medians")
    parser.add_argument("--cpu", type=int, default=None, help="pin the bare loop and the actor to this core")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--startup-timeout-s", type=float, default=60.0)
    args = parser.parse_args()

    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **dict.fromkeys(THREAD_VARS, "1")}
    os.environ.update(dict.fromkeys(THREAD_VARS, "1"))  # inherited by the spawned bare loop
    spec = envs.probe(ENV_ID)
    hidden = tuple(args.hidden)
    params = initial_params(spec, hidden, args.seed)
    run_config = RunConfig(env_id=ENV_ID, num_envs=args.num_envs, rollout_length=args.rollout_length,
                           seed=args.seed, hidden_sizes=hidden)
    assign = wire.Assign(run="bench-actor", member=0, actor_index=0, config=run_config, env_spec=spec,
                         learner_endpoints=(), weights=wire.Weights(member=0, version=0, params=params))

    print(f"{ENV_ID} × {args.num_envs}, policy {'×'.join(map(str, hidden))}, rollout {args.rollout_length}, "
          f"warm-up {args.warmup_s:g} s, window {args.window_s:g} s, {args.repeats} repeat(s), "
          f"cpu {'any' if args.cpu is None else args.cpu}", flush=True)
    bare_rates, actor_rates = [], []
    for i in range(args.repeats):
        bare = run_bare(params, args)
        actor = run_actor(assign, args, child_env)
        bare_rates.append(bare.valid_per_s)
        actor_rates.append(actor.valid_per_s)
        print(f"[{i + 1}/{args.repeats}] bare {bare.valid_per_s:>11,.0f}/s ({bare.slot_per_s:,.0f} slot-steps/s)"
              f"   actor {actor.valid_per_s:>11,.0f}/s ({actor.slot_per_s:,.0f} slot-steps/s)"
              f"   ratio {actor.valid_per_s / bare.valid_per_s:.3f}", flush=True)
    bare_median, actor_median = float(np.median(bare_rates)), float(np.median(actor_rates))
    ratio = actor_median / bare_median  # of medians: one slow repeat of either side cannot sway it
    print(f"bare loop : {bare_median:>12,.0f} env steps/s (median)")
    print(f"actor     : {actor_median:>12,.0f} env steps/s (median)")
    print(f"actor/bare: {ratio:12.3f}  (target ≥ 0.9: {'met' if ratio >= 0.9 else 'NOT met'})")


if __name__ == "__main__":
    main()
