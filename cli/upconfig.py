"""What one `rlmq up` runs: the run config (a file, the shipped one for the env and algorithm, or
the library defaults, with flags on top), the run id and directory, and how the processes meet.
`--resume` takes all of it from an earlier run's directory instead."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlmq.cli.shipped import pick
from rlmq.common.config import DEVICE_PATTERN, RunConfig
from rlmq.common.loading import from_mapping, load_run_config, to_json

# What a resumed run may change: how long it goes on, and how often its learners checkpoint.
RESUMABLE = frozenset({"total_steps", "target_return", "checkpoint_interval_s"})


@dataclass(frozen=True)
class UpConfig:
    actors: int
    learners: int
    run_config: RunConfig
    run: str
    run_dir: Path
    redis_url: str | None = None  # None: a private server, its data under run_dir/redis
    torch_threads: int = 1
    device: str = "auto"  # the learners' (distributed.choose_device)
    actor_device: str = "auto"  # where actors run a convolutional policy (models.acting_device)
    bind_host: str = "127.0.0.1"  # every listener of every process: none is reachable from elsewhere
    collective_timeout_s: float = 30.0
    transport: str = "ipc"  # experience from actors to learners: over Unix sockets, or loopback TCP
    secure: bool = True  # CURVE on every ZeroMQ socket, with keys made for the run (run_dir/keys)
    config_from: str = ""  # what the run config was read from: a file, "a RunConfig object", "": the library defaults
    resume: bool = False  # continue the run in run_dir: its Redis state, its learners' checkpoints

    @classmethod
    def build(
        cls,
        *,
        actors: int,
        learners: int,
        config: RunConfig | Path | None,
        overrides: dict[str, Any],
        redis_url: str | None,
        run_dir: Path | None,
        torch_threads: int,
        device: str = "auto",
        bind_host: str = "127.0.0.1",
        collective_timeout_s: float = 30.0,
        transport: str = "ipc",
        secure: bool = True,
        actor_device: str = "auto",
    ) -> UpConfig:
        config_file = config if isinstance(config, Path) else None
        if config is None:  # the shipped config for the env and algorithm, if any
            defaults = RunConfig()
            found = pick(overrides.get("env_id", defaults.env_id), overrides.get("algo", defaults.algo))
            config_file = found.path if found else None
        if isinstance(config, RunConfig):  # checked as a file's fields are
            run_config = from_mapping(RunConfig, {**json.loads(to_json(config)), **overrides})
        elif config_file is not None:
            run_config = load_run_config(config_file, overrides)
        else:
            run_config = from_mapping(RunConfig, overrides)
        check_flags(actors, run_config, bind_host, device, transport, actor_device)
        run = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        return cls(
            actors=actors,
            learners=learners,
            run_config=run_config,
            run=run,
            run_dir=run_dir or Path("runs") / run,
            redis_url=redis_url,
            torch_threads=torch_threads,
            device=device,
            bind_host=bind_host,
            collective_timeout_s=collective_timeout_s,
            transport=transport,
            secure=secure,
            config_from="a RunConfig object" if isinstance(config, RunConfig) else str(config_file or ""),
            actor_device=actor_device,
        )

    @classmethod
    def resume_run(
        cls,
        run_dir: Path,
        *,
        actors: int,
        learners: int | None,
        overrides: dict[str, Any],
        redis_url: str | None,
        torch_threads: int,
        device: str = "auto",
        bind_host: str = "127.0.0.1",
        collective_timeout_s: float = 30.0,
        transport: str = "ipc",
        secure: bool = True,
        actor_device: str = "auto",
    ) -> UpConfig:
        """The run in `run_dir` again: its id and config (with a new budget, target or checkpoint
        interval if given) and its Redis: the private server's data under `redis/`, else the URL
        it used (or `redis_url`, if the same Redis is reached another way now)."""
        try:
            saved = from_mapping(RunConfig, json.loads((run_dir / "config.json").read_text()))
            info = json.loads((run_dir / "run.json").read_text())
            run, used_url = str(info["run"]), str(info["redis_url"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"--resume {run_dir}: not a run directory of rlmq up ({exc})") from None
        fixed = sorted(set(overrides) - RESUMABLE)
        if fixed:
            raise ValueError(
                f"--resume goes on with the run's own config: {', '.join(fixed)} cannot change "
                "(--total-steps, --target-return and --checkpoint-every can)"
            )
        if learners is not None and learners != saved.num_learners:
            raise ValueError(
                f"the run has {saved.num_learners} learner(s), each with its own checkpoints: "
                f"use --learners {saved.num_learners}"
            )
        run_config = dataclasses.replace(saved, **overrides)
        check_flags(actors, run_config, bind_host, device, transport, actor_device)
        private = info.get("private_redis", (run_dir / "redis").is_dir())
        return cls(
            actors=actors,
            learners=saved.num_learners,
            run_config=run_config,
            run=run,
            run_dir=run_dir,
            redis_url=redis_url or (None if private else used_url),
            torch_threads=torch_threads,
            device=device,
            bind_host=bind_host,
            collective_timeout_s=collective_timeout_s,
            transport=transport,
            secure=secure,
            resume=True,
            actor_device=actor_device,
        )


def check_flags(
    actors: int, run_config: RunConfig, bind_host: str, device: str, transport: str, actor_device: str = "auto"
) -> None:
    if actors < run_config.population:  # a member without an actor would never train
        raise ValueError(
            f"{actors} actor(s) for a population of {run_config.population}: "
            f"use --actors {run_config.population} or more"
        )
    if bind_host != "*" and not re.fullmatch(r"\d{1,3}(\.\d{1,3}){3}", bind_host):
        raise ValueError(f"--bind-host {bind_host}: use an IPv4 address of this machine, or * for every interface")
    if bind_host != "*":
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((bind_host, 0))
        except OSError as exc:
            raise ValueError(
                f"--bind-host {bind_host} is not an address of this machine ({exc.strerror}): use one "
                "of its own (`ip -4 addr`), 127.0.0.1, or * for every interface"
            ) from None
    for flag, value in (("--device", device), ("--actor-device", actor_device)):
        if not re.fullmatch(DEVICE_PATTERN, value):
            raise ValueError(f"{flag} {value}: use auto, cpu, cuda or cuda:N")
    if device.startswith("cuda"):  # the actors' device is checked where their encoder is known (acting_device)
        check_gpu(device)
    if transport not in ("ipc", "tcp"):
        raise ValueError(f"--transport {transport}: use ipc or tcp")


def check_gpu(device: str) -> None:
    """ValueError unless torch sees the GPU the learners' `device` names, before any process starts
    (a learner world that cannot start would be restarted again and again)."""
    import torch  # only when a GPU is asked for: `rlmq up` itself needs no torch

    index = int(device.partition(":")[2] or 0)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index >= count:
        found = f"{count} GPU(s)" if count else "no GPU"
        raise ValueError(f"--device {device}: torch sees {found} on this machine; use --device auto or cpu")


def probe_run_dir(path: Path) -> None:
    """OSError unless `path` can be created and written to, found before any process starts. The
    directories it makes are removed again, so that bad usage found later (an unknown env) leaves
    no empty run directory behind; `run_up` makes them for good."""
    made = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    finally:
        for directory in made:
            with contextlib.suppress(OSError):  # never made, or someone else wrote into it since
                directory.rmdir()
