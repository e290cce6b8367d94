"""`rlmq up` and `rlmq.train`: the options of a local run made into an `UpConfig`, checked before
anything starts, then run under a `Supervisor` to its verdict. The CLI prints a refusal as one
`error:` line; the Python API raises it."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rlmq.cli import run_redis, rundir
from rlmq.cli.redis_server import RedisServer
from rlmq.cli.supervisor import Supervisor
from rlmq.cli.upconfig import UpConfig, probe_run_dir
from rlmq.common import envs
from rlmq.common.config import RunConfig
from rlmq.common.loading import to_json
from rlmq.common.models import acting_device
from rlmq.common.redis_urls import shown_url
from rlmq.common.schema import EnvSpec
from rlmq.common.service import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TARGET_MISSED,
    EXIT_USAGE,
)
from rlmq.coordinator.records import RunStatus


class Refused(Exception):
    """A run that cannot start, and the exit status `rlmq up` gives it; the message names the fix."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message.removeprefix("error: "))
        self.code = code


def plan(
    *,
    actors: int = 4,
    learners: int | None = None,
    config: RunConfig | Path | None = None,
    env: str | None = None,
    algo: str | None = None,
    total_steps: int | None = None,
    target_return: float | None = None,
    num_envs: int | None = None,
    seed: int | None = None,
    population: int | None = None,
    method: str | None = None,
    checkpoint_every: float | None = None,
    redis_url: str | None = None,
    run_dir: Path | None = None,
    torch_threads: int = 1,
    device: str = "auto",
    actor_device: str = "auto",
    bind_host: str = "127.0.0.1",
    collective_timeout: float = 30.0,
    transport: str = "ipc",
    secure: bool = True,
    resume: Path | None = None,
) -> UpConfig:
    """What `rlmq up` with these options runs (its flags, by the same names); Refused naming the fix."""
    overrides = {
        k: v
        for k, v in dict(
            env_id=env,
            algo=algo,
            total_steps=total_steps,
            target_return=target_return,
            num_envs=num_envs,
            seed=seed,
            population=population,
            method=method,
            checkpoint_interval_s=checkpoint_every,
        ).items()
        if v is not None
    }
    options: dict[str, Any] = dict(
        actors=actors,
        overrides=overrides,
        redis_url=redis_url,
        torch_threads=torch_threads,
        device=device,
        bind_host=bind_host,
        collective_timeout_s=collective_timeout,
        transport=transport,
        secure=secure,
        actor_device=actor_device,
    )
    try:
        if resume is not None:
            if config is not None or run_dir is not None:
                raise ValueError("--resume takes the run's config and directory: drop --config and --run-dir")
            up_cfg = UpConfig.resume_run(resume, learners=learners, **options)
        else:
            overrides["num_learners"] = learners or 1
            up_cfg = UpConfig.build(learners=learners or 1, config=config, run_dir=run_dir, **options)
    except (OSError, ValueError) as exc:  # tomllib/json errors are ValueErrors too
        fix = (
            ""
            if resume is not None
            else ". Fix the flag or the --config file (fields: common/config.py; an algorithm's section: "
            "common/algorithms.py)."
        )
        raise Refused(f"{exc}{fix}") from None
    try:
        probe_run_dir(up_cfg.run_dir)
    except OSError as exc:
        raise Refused(
            f"cannot use {up_cfg.run_dir} as the run directory ({exc.strerror or exc}): "
            "pass a --run-dir where you can create and write files"
        ) from None
    return up_cfg


def preflight(cfg: UpConfig) -> EnvSpec:
    """The env's spec, once the env, the devices, Redis and the run directory are found fit, before
    anything starts; Refused naming the fix."""
    run = cfg.run_config
    try:
        spec = envs.probe(run.env_id, run.algo, run.encoder, run.frame_stack)
        if cfg.actor_device.startswith("cuda"):  # a GPU named and not there: say so before anything starts
            acting_device(cfg.actor_device, cfg.run_config.encoder_for(spec))
    except (envs.EnvError, ValueError) as exc:
        raise Refused(str(exc)) from None
    if cfg.redis_url is not None:  # before anything starts: a wrong URL is a one-line error
        problem = run_redis.unreachable(cfg.redis_url, cfg.run)
        if problem:
            raise Refused(problem, EXIT_FAILED)
    if not cfg.resume and any((cfg.run_dir / "checkpoints").glob("rank*/*.pt")):  # its learners would resume them
        raise Refused(
            f"{cfg.run_dir} holds an earlier run: continue it with --resume {cfg.run_dir}, or choose another --run-dir"
        )
    return spec


def run_up(cfg: UpConfig, redis_outage_s: float = 30.0) -> int:
    """The run, from start to end: its exit status (common/service.py's EXIT_*), its verdict printed.
    Refused where it cannot start."""
    spec = preflight(cfg)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    (cfg.run_dir / "config.json").write_text(to_json(cfg.run_config))
    rundir.point_latest(cfg.run_dir)
    try:
        redis_server = None if cfg.redis_url else RedisServer(cfg.run_dir / "redis", password=True)
    except RuntimeError as exc:  # no binary, or it would not start: the message says what to do
        raise Refused(str(exc), EXIT_FAILED) from None
    redis_url = cfg.redis_url or redis_server.url  # type: ignore[union-attr]
    if cfg.resume and not run_redis.reopen(redis_url, cfg.run, cfg.run_config):
        if redis_server is not None:
            redis_server.stop()
        raise Refused(f"run {cfg.run} is not in the Redis at {shown_url(redis_url)}: nothing to resume", EXIT_FAILED)
    supervisor = Supervisor(cfg, redis_url, redis_server, redis_outage_s)
    with rundir.atomic(cfg.run_dir / "run.json") as tmp:  # `rlmq status` may read it at any moment
        tmp.write_text(
            json.dumps(
                {
                    "run": cfg.run,
                    "redis_url": supervisor.redis_address,
                    "pid": os.getpid(),
                    "redis_password_file": supervisor.redis_password_file,
                    "private_redis": redis_server is not None,
                }
            )
        )
    supervisor.install_signals()
    launched = time.time()
    try:
        print(
            f"rlmq up: run {cfg.run} in {cfg.run_dir}: {cfg.actors} actor(s) × {cfg.run_config.num_envs} "
            f"{cfg.run_config.env_id}, {cfg.learners} learner(s), {cfg.run_config.algo}",
            flush=True,
        )
        if cfg.resume:
            print(
                f"rlmq up: config: the run's own, {cfg.run_dir / 'config.json'} (with --total-steps, "
                "--target-return and --checkpoint-every if given)"
            )
        else:
            print(
                f"rlmq up: config {cfg.config_from}"
                if cfg.config_from
                else "rlmq up: config: the library "
                f"defaults (no shipped config for {cfg.run_config.env_id} + {cfg.run_config.algo}; `rlmq configs` "
                "lists them)"
            )
        if not cfg.secure:
            print(
                "rlmq up: --insecure: ZeroMQ traffic is neither authenticated nor encrypted; any process on "
                "this host can join the run. For a trusted single host only.",
                file=sys.stderr,
                flush=True,
            )
        supervisor.plan()
        for child in supervisor.children:
            if child.role == "coordinator":  # the one child that talks to Redis
                child.argv += ["--redis-outage-s", str(redis_outage_s)]
        supervisor.start()
        outcome = supervisor.watch(supervisor.redis.watching_store())
        supervisor.shut_down()
        if outcome == "over":
            outcome = supervisor.final_checkpoint_refused() or outcome
        try:
            status = supervisor.redis.save_results(spec, launched, outcome)
        except OSError as exc:  # the disk that ended the run, or full now: what is written stays
            status = supervisor.redis.seen.status
            outcome = (
                f"{outcome}; and writing the results to {cfg.run_dir} failed: {exc.strerror or exc}"
                if outcome.startswith("failed")
                else f"failed: writing the results to {cfg.run_dir}: {exc.strerror or exc}; free space, then "
                f"`rlmq up --resume {cfg.run_dir}` writes them"
            )
    finally:
        supervisor.kill_all(signal.SIGKILL)
        supervisor.sockets.remove()
        if redis_server is not None:
            redis_server.stop()
    return verdict(outcome, status, cfg.run_config)


def verdict(outcome: str, status: RunStatus, run_config: RunConfig) -> int:
    if outcome == "interrupted":
        print("interrupted; results so far are in the run directory", file=sys.stderr)
        return EXIT_INTERRUPTED
    if outcome.startswith("failed"):
        print(f"error: run {outcome}", file=sys.stderr)
        return EXIT_FAILED
    detail = status.detail
    if status.evaluated_return is not None and status.reason != "target":  # the target's detail says it already
        detail += (
            f"; the run's own evaluation: {status.evaluated_return:.1f} ± {status.evaluated_std:.1f} over "
            f"{status.evaluated_episodes} {'deterministic' if status.evaluated_deterministic else 'sampled'} "
            f"episodes (member {status.evaluated_member}, version {status.evaluated_version})"
        )
    if status.success:
        print(f"done: {detail}")
        return EXIT_OK
    print(
        f"target not reached: {detail} (target return {run_config.target_return}); raise "
        "--total-steps or tune the config",
        file=sys.stderr,
    )
    return EXIT_TARGET_MISSED
