"""One actor's env-steps/s against the bare env-plus-policy loop it is built around.

Two loops, each in its own process, started once and then run in turns, so that they never share
a core:

1. the bare loop: `make_vector_env(--env, N)` (CartPole's native vector env by default), then
   `NumpyPolicy.act` and `env.step` on every step, nothing else. Between its turns it waits on a
   pipe;
2. the real actor, `python -m rlmq.cli actor ...`, talking over real ZeroMQ sockets to peers this
   script runs: a stand-in coordinator (ROUTER that answers the actor's `Hello` with an `Assign`
   carrying the run config and initial weights, and ignores its reports), a PUB socket at the
   broadcast endpoint (silent), and a sink that plays a learner (ROUTER that decodes every rollout
   with `wire.decode`, as a learner would). During the actor's turn the sink keeps `--credits`
   credits out, so the actor never waits; between its turns it grants none, and the actor idles
   as it does when its learner is busy.

Both use the same weights (a fresh `ActorCritic(spec, --hidden)`, behind the convolutional encoder
`RunConfig.encoder` picks for an image env) and count the same thing: valid
env steps (`Rollout.valid`: the step a next-step autoreset spends resetting a slot is not counted).
After `--warmup-s` seconds of warm-up each (the actor's counted from its first rollout, so its
start-up is excluded), `--pairs` times: a bare turn, then an actor turn, each `--ramp-s` seconds
not counted and then a `--window-s` window counted. Turns of a few seconds, side by side, keep both
loops in the same phase of a host whose speed drifts by tens of per cent within minutes; the
figure is the median of the pairs' ratios (with the ratio of the two sides' medians beside it).
It also prints the actor's start-up: launch → its first rollout at the sink.
Children run with OMP/OPENBLAS/MKL threads=1; `--cpu K` pins both measured loops to core K (the
peers stay unpinned: give them another core). With `--secure`, the peers serve on CURVE behind a
gatekeeper and the actor connects with its key (`rlmq keys`; `common/security.py`), as in
`rlmq up --secure`. Target: actor / bare ≥ 0.9 (≥ 0.8 for pixels).

    python benchmarks/bench_actor.py --num-envs 64 --pairs 15
    python benchmarks/bench_actor.py --env ALE/Pong-v5 --num-envs 8 --hidden 512 --pairs 7
    python benchmarks/bench_actor.py --num-envs 64 --pairs 15 --core lstm   # a recurrent policy's
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import zmq

from rlmq.common import envs, transport, wire
from rlmq.common.config import RunConfig
from rlmq.common.models import NumpyPolicy
from rlmq.common.schema import EnvSpec
from rlmq.common.security import Credentials, create_keys, log_refusal

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


def initial_params(
    spec: EnvSpec, hidden: tuple[int, ...], encoder: str, seed: int, core: str = "identity", core_size: int = 64
) -> wire.Params:
    """Weights of a fresh learner network, as the learner would publish them (torch only here)."""
    import torch

    from rlmq.learners.networks import ActorCritic

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.helpers: the references
    from tests.helpers.references import to_numpy_params

    torch.manual_seed(seed)
    return to_numpy_params(ActorCritic(spec, hidden, encoder=encoder, core=core, core_size=core_size))


# --- (1) the bare loop ------------------------------------------------------------------------


def bare_loop(conn: Connection, cpu: int | None, params: wire.Params, run_config: RunConfig) -> None:
    """In a child process: on each (ramp, window) from the pipe, step for `ramp` seconds, then count
    for `window` seconds and send the Rate back; None ends it."""
    pin(cpu)  # the parent is not pinned: it runs the peers
    num_envs, seed = run_config.num_envs, run_config.seed
    env = envs.make_vector_env(run_config.env_id, num_envs, frame_stack=run_config.frame_stack)
    spec = envs.describe(env, run_config.env_id)
    policy = NumpyPolicy(params, spec, encoder=run_config.encoder_for(spec))
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    prev_done = np.zeros(num_envs, dtype=bool)
    # A recurrent policy's slot states, zeroed the step after an autoreset step (as the collector).
    state = np.zeros((num_envs, policy.state_size), np.float32) if policy.state_size else None
    resetting = np.zeros(num_envs, dtype=bool)
    while (turn := conn.recv()) is not None:
        ramp, window = turn
        start = time.perf_counter()
        window_start = start + ramp
        end = window_start + window
        counting, valid, slots, now = False, 0, 0, start
        while now < end:
            if state is not None:
                state[resetting] = 0.0
                resetting = prev_done
            actions, _logp = policy.act(obs, rng, None, state)
            obs, _reward, term, trunc, _ = env.step(actions)
            if counting:
                valid += num_envs - int(np.count_nonzero(prev_done))
                slots += num_envs
            prev_done = term | trunc
            now = time.perf_counter()
            if not counting and now >= window_start:
                counting, window_start = True, now
        conn.send(Rate(valid, slots, now - window_start))
    env.close()


def pin(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


# --- (2) the real actor against stand-in peers ------------------------------------------------


class Peers:
    """Coordinator stand-in, silent broadcast and a learner-like sink, on one ZeroMQ context."""

    def __init__(self, assign: wire.Assign, credits: int, keys_dir: str = "") -> None:
        ctx: zmq.Context = zmq.Context.instance()
        credentials = Credentials.load(keys_dir, None, serves=True)
        self.gatekeeper = credentials.gatekeeper(ctx, log_refusal)
        self.control = transport.make_socket(ctx, zmq.ROUTER, hwm=1000)
        self.broadcast = transport.make_socket(ctx, zmq.PUB, hwm=100)
        self.sink = transport.make_socket(ctx, zmq.ROUTER, hwm=1000)
        for sock in (self.control, self.broadcast, self.sink):
            credentials.server(sock)
        self.control_endpoint = transport.bind(self.control, "tcp://127.0.0.1:0")
        self.broadcast_endpoint = transport.bind(self.broadcast, "tcp://127.0.0.1:0")
        self.sink_endpoint = transport.bind(self.sink, "tcp://127.0.0.1:0")
        self.assign_frame = wire.encode(dataclasses.replace(assign, learner_endpoints=(self.sink_endpoint,)))
        self.credits = credits
        self.granting = False  # credits go out during the actor's turns only
        self.actor: bytes | None = None  # the actor's identity on the sink
        self.outstanding = 0  # credits the actor holds
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
            identity, encoded = self.control.recv_multipart()
            try:
                if isinstance(wire.decode(encoded), wire.Hello):  # ActorReports are ignored
                    self.control.send_multipart([identity, self.assign_frame])
            except wire.WireError:
                self.rejected += 1

    def on_sink(self) -> None:
        """What `Learner.receive` does, less the queue: decode, check, count, grant credits."""
        while self.sink.poll(0, zmq.POLLIN):
            identity, encoded = self.sink.recv_multipart(copy=False)
            try:
                message = wire.decode(encoded.buffer)
            except wire.WireError:
                self.rejected += 1
                continue
            if isinstance(message, wire.Hello):
                self.actor = identity.bytes
            elif isinstance(message, wire.Rollout):
                now = time.perf_counter()
                self.first_rollout_at = self.first_rollout_at or now
                self.arrivals.append((now, int(message.valid.sum()), message.valid.size))
                self.outstanding -= 1
            self.grant()

    def grant(self) -> None:
        """Top the actor's credits up to `credits` while granting."""
        if self.granting and self.actor is not None and self.outstanding < self.credits:
            count = self.credits - self.outstanding
            self.sink.send_multipart([self.actor, wire.encode(wire.Credit(count))])
            self.outstanding += count

    def turn(self, ramp: float, window: float) -> Rate:
        """The actor's turn: credits out for `ramp` + `window` seconds; rollouts that arrive in the
        window counted. Ends granting, and returns once the actor has spent what it holds: it must
        idle through the bare turn, not collect beside it."""
        self.granting = True
        self.grant()
        window_start = time.perf_counter() + ramp
        window_end = window_start + window
        self.serve(window_end)
        self.granting = False
        counted = [(v, n) for t, v, n in self.arrivals if window_start < t <= window_end]
        deadline = time.perf_counter() + 60.0
        while self.outstanding > 0 and time.perf_counter() < deadline:
            self.serve(time.perf_counter() + 0.05)
        self.arrivals.clear()
        return Rate(sum(v for v, _ in counted), sum(n for _, n in counted), window)

    def close(self) -> None:
        for sock in (self.control, self.broadcast, self.sink):
            sock.close()
        if self.gatekeeper is not None:
            self.gatekeeper.stop()


def run_pairs(
    assign: wire.Assign, params: wire.Params, args: argparse.Namespace, child_env: dict[str, str]
) -> list[tuple[Rate, Rate]]:
    """Start both loops, warm both up, then `--pairs` × (bare turn, actor turn)."""
    keys_dir = ""
    if args.secure:  # a run's keys, for this one run of the script
        scratch = tempfile.mkdtemp(prefix="rlmq-bench-keys-")
        atexit.register(shutil.rmtree, scratch, True)
        keys_dir = str(Path(scratch) / "keys")
        create_keys(Path(keys_dir), learners=0, actors=1)
    peers = Peers(assign, args.credits, keys_dir)
    argv = [
        sys.executable,
        "-m",
        "rlmq.cli",
        "actor",
        "--name",
        "actor-0",
        "--coordinator",
        peers.control_endpoint,
        "--broadcast",
        peers.broadcast_endpoint,
        "--metrics-port",
        "-1",
        "--keys",
        keys_dir,
    ]
    launched = time.perf_counter()
    actor = subprocess.Popen(argv, env=child_env, stdin=subprocess.DEVNULL, preexec_fn=lambda: pin(args.cpu))
    ctx = mp.get_context("spawn")  # a fresh interpreter: no torch loaded, same thread limits
    conn, child_conn = ctx.Pipe()
    bare = ctx.Process(target=bare_loop, args=(child_conn, args.cpu, params, assign.config))
    bare.start()

    def bare_turn(ramp: float, window: float) -> Rate:
        conn.send((ramp, window))
        while not conn.poll(0):  # the actor keeps reporting meanwhile
            peers.serve(time.perf_counter() + 0.05)
        rate: Rate = conn.recv()
        return rate

    try:
        peers.granting = True
        deadline = time.perf_counter() + args.startup_timeout_s
        while peers.first_rollout_at is None:
            if actor.poll() is not None or time.perf_counter() > deadline:
                raise RuntimeError(f"no rollout within {args.startup_timeout_s} s (actor exit code {actor.poll()})")
            peers.serve(time.perf_counter() + 0.1)
        print(
            f"actor start-up: {peers.first_rollout_at - launched:.2f} s from launch to its first rollout at the sink "
            "(the bare loop's process starts alongside)",
            flush=True,
        )
        peers.turn(args.warmup_s, 0.0)
        bare_turn(args.warmup_s, 0.0)
        pairs = []
        for i in range(args.pairs):
            pair = bare_turn(args.ramp_s, args.window_s), peers.turn(args.ramp_s, args.window_s)
            if actor.poll() is not None:
                raise RuntimeError(f"the actor exited with {actor.returncode}")
            print(
                f"[{i + 1}/{args.pairs}] bare {pair[0].valid_per_s:>11,.0f}/s   actor {pair[1].valid_per_s:>11,.0f}/s"
                f"   ratio {pair[1].valid_per_s / pair[0].valid_per_s:.3f}",
                flush=True,
            )
            pairs.append(pair)
    finally:
        conn.send(None)
        bare.join(10)
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
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1", help="env id (ALE/Pong-v5: pixels through the Nature CNN)")
    parser.add_argument("--num-envs", type=int, default=64, help="vector-env slots (N)")
    parser.add_argument("--rollout-length", type=int, default=32, help="steps per rollout (T)")
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64], help="policy hidden sizes")
    parser.add_argument("--core", default="identity", help="recurrent core: identity, lstm or gru")
    parser.add_argument("--core-size", type=int, default=64, help="the core's units")
    parser.add_argument("--warmup-s", type=float, default=2.0, help="each loop's warm-up, once")
    parser.add_argument("--ramp-s", type=float, default=0.5, help="uncounted start of each turn")
    parser.add_argument("--window-s", type=float, default=3.0, help="counted part of each turn")
    parser.add_argument("--credits", type=int, default=4, help="credits the sink keeps out in the actor's turns")
    parser.add_argument("--pairs", type=int, default=15, help="bare/actor turn pairs")
    parser.add_argument("--cpu", type=int, default=None, help="pin the bare loop and the actor to this core")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--startup-timeout-s", type=float, default=60.0)
    parser.add_argument("--secure", action="store_true", help="CURVE between the actor and its peers")
    args = parser.parse_args()

    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **dict.fromkeys(THREAD_VARS, "1")}
    os.environ.update(dict.fromkeys(THREAD_VARS, "1"))  # inherited by the spawned bare loop
    spec = envs.probe(args.env)
    hidden = tuple(args.hidden)
    run_config = RunConfig(
        env_id=args.env,
        num_envs=args.num_envs,
        rollout_length=args.rollout_length,
        seed=args.seed,
        hidden_sizes=hidden,
        core=args.core,
        core_size=args.core_size,
    )
    encoder = run_config.encoder_for(spec)
    params = initial_params(spec, hidden, encoder, args.seed, args.core, args.core_size)
    assign = wire.Assign(
        run="bench-actor",
        member=0,
        actor_index=0,
        config=run_config,
        env_spec=spec,
        learner_endpoints=(),
        weights=wire.Weights(member=0, version=0, params=params),
    )

    print(
        f"{args.env} × {args.num_envs}, policy {encoder} → "
        f"{'' if args.core == 'identity' else f'{args.core} {args.core_size} → '}{'×'.join(map(str, hidden))}, "
        f"rollout {args.rollout_length}, "
        f"warm-up {args.warmup_s:g} s, turns of {args.ramp_s:g} + {args.window_s:g} s, {args.pairs} pairs, "
        f"cpu {'any' if args.cpu is None else args.cpu}",
        flush=True,
    )
    pairs = run_pairs(assign, params, args, child_env)
    bare_median = float(np.median([b.valid_per_s for b, _ in pairs]))
    actor_median = float(np.median([a.valid_per_s for _, a in pairs]))
    ratio = float(np.median([a.valid_per_s / b.valid_per_s for b, a in pairs]))
    target = 0.9 if encoder == "mlp" else 0.8  # pixels: the target
    print(f"bare loop : {bare_median:>12,.0f} env steps/s (median)")
    print(f"actor     : {actor_median:>12,.0f} env steps/s (median)")
    print(
        f"actor/bare: {ratio:12.3f}  median of the pairs' ratios "
        f"(target ≥ {target}: {'met' if ratio >= target else 'NOT met'}); "
        f"ratio of the medians {actor_median / bare_median:.3f}"
    )


if __name__ == "__main__":
    main()
