"""The run's own evaluator: a child process of the coordinator that plays a member's weights for
whole episodes (common/episodes.py), so that the verdict on the target and PBT's fitness never rest
on what an actor says (docs/architecture.md, "The run judges its policies itself").

    coordinator  EvaluationRequest →  evaluator   (one at a time, over a private Unix socket)
                 ← EvaluationResult

A process, not a thread of the coordinator: playing an env holds the GIL, and the user's env code
may hang or crash, which costs a child process and never the coordinator. The child binds the
socket in a directory only this user can enter, and the coordinator connects to it: a connecting
socket queues the request until the child is up, and reconnects to a child started again.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import zmq

from rlmq.common import envs, wire
from rlmq.common.episodes import play_side_by_side
from rlmq.common.models import make_policy
from rlmq.common.service import StopFlag, configure_logging, die_with_parent, install_signal_handlers

log = logging.getLogger("rlmq.coordinator")
POLL_MS = 500


class Evaluator:
    """The coordinator's end: starts the child, asks it one request at a time, and gives up on one
    the child does not answer within `timeout_s` or dies over (the child is started again)."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], timeout_s: float, env_id: str) -> None:
        self.timeout_s, self.env_id = timeout_s, env_id
        self.directory = tempfile.mkdtemp(prefix="rlmq-evaluator-")  # mode 0700
        self.endpoint = f"ipc://{self.directory}/evaluator.sock"
        self.socket = ctx.socket(zmq.PAIR)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
        self.socket.connect(self.endpoint)
        self.process: subprocess.Popen[bytes] | None = None
        self.asked: tuple[wire.EvaluationRequest, float] | None = None  # and when (monotonic)
        self.starts = 0

    def start(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rlmq.coordinator.evaluator", self.endpoint, self.env_id],
            env=env,
            preexec_fn=die_with_parent,
        )
        self.starts += 1

    @property
    def busy(self) -> bool:
        return self.asked is not None

    def ask(self, request: wire.EvaluationRequest) -> None:
        if self.process is None or self.process.poll() is not None:
            self.start()
        self.socket.send(wire.encode(request))  # queued by the connecting socket until the child binds
        self.asked = (request, time.monotonic())

    def answer(self) -> tuple[wire.EvaluationRequest, wire.EvaluationResult] | None:
        """The request asked and its result, if one is in (or given up: a result with an error)."""
        if self.asked is None:
            return None
        request, at = self.asked
        while self.socket.poll(0):
            encoded = self.socket.recv()
            try:
                result = wire.decode(encoded)
            except wire.WireError as exc:
                result = wire.EvaluationResult(id=request.id, error=f"the evaluator sent {exc}")
            if isinstance(result, wire.EvaluationResult) and result.id == request.id:
                self.asked = None
                return request, result
        assert self.process is not None
        exited = self.process.poll()
        if exited is None and time.monotonic() - at < self.timeout_s:
            return None
        why = (
            f"the evaluator exited with {exited}"
            if exited is not None
            else f"no result within evaluation.timeout_s = {self.timeout_s:g} s"
        )
        self.stop_child()
        self.asked = None
        return request, wire.EvaluationResult(id=request.id, error=why)

    def stop_child(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def close(self) -> None:
        self.stop_child()
        self.socket.close(0)
        shutil.rmtree(self.directory, ignore_errors=True)


def evaluate(request: wire.EvaluationRequest) -> wire.EvaluationResult:
    started = time.perf_counter()
    weights = request.weights
    try:
        policy = make_policy(
            request.config, dict(weights.params), request.env_spec, weights.trained_steps, activation=weights.activation
        )
        run = request.config
        played = play_side_by_side(
            policy,
            run.env_id,
            request.env_spec,
            request.episodes,
            request.seed,
            request.deterministic,
            frame_stack=run.frame_stack,
        )
    except Exception as exc:  # the user's env code, or weights that do not fit: say so, and go on serving
        log.exception("evaluation %d failed", request.id)
        return wire.EvaluationResult(id=request.id, error=f"{type(exc).__name__}: {exc}"[:1000])
    return wire.EvaluationResult(
        id=request.id,
        returns=np.asarray(played.returns, np.float64),
        lengths=np.asarray(played.lengths, np.int64),
        seconds=time.perf_counter() - started,
    )


def warm_up(env_id: str) -> None:
    """Build the env once, before any request: its package's imports (MuJoCo's, a user's module)
    are paid while the run trains, not by the evaluation at its end."""
    try:
        envs.make_vector_env(env_id, 1).close()
    except Exception:  # the request will fail the same way, and say so
        log.exception("the evaluator could not build %s", env_id)


def serve(endpoint: str, stop: StopFlag) -> int:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    try:
        while not stop.is_set():
            if not sock.poll(POLL_MS):
                continue
            try:
                request = wire.decode(sock.recv())
            except wire.WireError as exc:  # only the coordinator can reach this socket: a bug, not an attack
                log.error("dropped a request: %s", exc)
                continue
            if isinstance(request, wire.EvaluationRequest):
                sock.send(wire.encode(evaluate(request)))
    finally:
        sock.close(0)
        ctx.term()
    return 0


if __name__ == "__main__":
    configure_logging("evaluator")
    flag = StopFlag()
    install_signal_handlers(flag, log)
    warm_up(sys.argv[2])
    sys.exit(serve(sys.argv[1], flag))
