"""The services' commands, what a container runs: `rlmq coordinator`, `rlmq learner`, `rlmq actor`.

Each builds its service's frozen config from its options and runs it (`learner --restart` runs a
supervisor of the rank instead). Service modules are imported inside each command, so that an actor
never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlmq.cli.options import (
    ACTOR_DEVICE_HELP,
    Announce,
    BindHost,
    Broadcast,
    Coord,
    Fd,
    KeysDir,
    MetricsPort,
    RedisOutage,
    RedisPasswordFile,
    Run,
    opt,
    require_keys,
    require_redis_url,
)
from rlmq.common.service import (
    EXIT_USAGE,
    StopFlag,
    configure_logging,
    install_signal_handlers,
    limit_threads,
    open_files_as_allowed,
)


def start_service(name: str, torch_threads: int = 1) -> StopFlag:
    limit_threads(torch_threads)
    open_files_as_allowed()
    log = configure_logging(name)
    stop = StopFlag()
    install_signal_handlers(stop, log)
    return stop


def coordinator(
    run: Run = "default",
    redis_url: Annotated[str, opt("Redis URL.", "REDIS_URL")] = "redis://127.0.0.1:6379/0",
    run_config: Annotated[Path | None, opt("Run config file (TOML or JSON).", "RUN_CONFIG")] = None,
    control_bind: Annotated[str, opt("Bind address of the control ROUTER.", "CONTROL_BIND")] = "tcp://*:5555",
    broadcast_bind: Annotated[str, opt("Bind address of the broadcast PUB.", "BROADCAST_BIND")] = "tcp://*:5556",
    metrics_port: MetricsPort = 0,
    bind_host: BindHost = "*",
    announce: Announce = "",
    control_fd: Fd = -1,
    broadcast_fd: Fd = -1,
    redis_outage_s: RedisOutage = 30.0,
    redis_password_file: RedisPasswordFile = "",
    keys: KeysDir = "",
    tensorboard_dir: Annotated[
        str, opt("Write the run's TensorBoard curves here (needs rlmq[tensorboard]); empty: none.", "TENSORBOARD_DIR")
    ] = "",
    tensorboard_max_mb: Annotated[
        float, opt("The curves stop growing past this size (MiB).", "TENSORBOARD_MAX_MB", min=1.0)
    ] = 256.0,
    failpoint: Annotated[str, opt("Tests only: die at this named point.", "FAILPOINT", hidden=True)] = "",
) -> None:
    """Run the coordinator: registration, Redis state and weights, PBT, end of run."""
    require_redis_url(redis_url)
    require_keys(keys, None, True, "coordinator")
    stop = start_service("coordinator")
    from rlmq.common.config import CoordinatorConfig, RunConfig
    from rlmq.common.loading import load_run_config
    from rlmq.common.redis_urls import with_password
    from rlmq.coordinator.process import main

    try:
        config = load_run_config(run_config, {}) if run_config else RunConfig()
    except (OSError, ValueError) as exc:
        typer.echo(f"error: run config {run_config}: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    try:
        redis_url = with_password(redis_url, redis_password_file)
    except OSError as exc:
        typer.echo(f"error: --redis-password-file {redis_password_file}: {exc.strerror or exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    cfg = CoordinatorConfig(
        run=run,
        redis_url=redis_url,
        run_config=config,
        control_bind=control_bind,
        broadcast_bind=broadcast_bind,
        metrics_port=metrics_port,
        bind_host=bind_host,
        announce_file=announce,
        control_fd=control_fd,
        broadcast_fd=broadcast_fd,
        redis_outage_s=redis_outage_s,
        keys_dir=keys,
        tensorboard_dir=tensorboard_dir,
        tensorboard_max_mb=tensorboard_max_mb,
        failpoint=failpoint,
    )
    raise typer.Exit(main(cfg, stop))


def learner(
    run: Run = "default",
    coordinator: Coord = "tcp://127.0.0.1:5555",
    broadcast: Broadcast = "tcp://127.0.0.1:5556",
    rank: Annotated[int, opt("This learner's rank.", "RANK")] = 0,
    world_size: Annotated[int, opt("Number of learner ranks.", "WORLD_SIZE")] = 1,
    master_addr: Annotated[
        str,
        opt(
            "Rank 0's address (torch.distributed); auto: rank 0's advertised address, from the coordinator.",
            "MASTER_ADDR",
        ),
    ] = "auto",
    master_port: Annotated[int, opt("Rendezvous port.", "MASTER_PORT")] = 29500,
    advertise_host: Annotated[
        str,
        opt(
            "Address actors and the other ranks reach this learner at; auto: the one "
            "this host reaches the coordinator from.",
            "ADVERTISE_HOST",
        ),
    ] = "auto",
    experience_port: Annotated[
        int | None, opt("Experience ROUTER port (0: any); default 5557 + rank.", "EXPERIENCE_PORT")
    ] = None,
    experience_fd: Fd = -1,
    experience_ipc: Annotated[
        str,
        opt(
            "Serve experience on this Unix socket path (ipc://) instead of TCP: for actors on this host.",
            "EXPERIENCE_IPC",
        ),
    ] = "",
    metrics_port: MetricsPort = 0,
    device: Annotated[str, opt("auto, cpu or cuda[:N].", "DEVICE")] = "auto",
    torch_threads: Annotated[int, opt("Intra-op threads.", "TORCH_THREADS", min=1)] = 1,
    bind_host: BindHost = "*",
    announce: Announce = "",
    master_fd: Fd = -1,
    collective_timeout: Annotated[
        float, opt("Seconds a collective may wait for a peer rank.", "COLLECTIVE_TIMEOUT_S", min=1.0)
    ] = 30.0,
    credit_timeout_min: Annotated[
        float,
        opt(
            "A credit unused this long, or 4x the slowest recent rollout if longer, is taken back (its actor died).",
            "CREDIT_TIMEOUT_MIN_S",
            min=0.01,
        ),
    ] = 0.5,
    checkpoint_dir: Annotated[
        str,
        opt(
            "Where learner checkpoints go (each rank under rank{r}/) and a restarted world resumes from; empty: none.",
            "CHECKPOINT_DIR",
        ),
    ] = "",
    keys: KeysDir = "",
    failpoint: Annotated[str, opt("Tests only: die at this named point.", hidden=True)] = "",
    restart: Annotated[
        bool,
        opt(
            "Start this rank again whenever its world is lost (a peer died or was cut off): "
            "with --checkpoint-dir, the new world resumes where the old one was."
        ),
    ] = False,
) -> None:
    """Run one learner rank."""
    require_keys(keys, f"learner-{rank}", True, f"learner-{rank}")
    stop = start_service(f"learner-{rank}", torch_threads)
    if restart:
        import sys

        from rlmq.cli.restarts import restarting

        if sys.argv[1:2] != ["learner"]:
            typer.echo("error: --restart works from the command line (rlmq learner ... --restart)", err=True)
            raise typer.Exit(EXIT_USAGE)
        raise typer.Exit(restarting([a for a in sys.argv[2:] if a != "--restart"], stop))
    from rlmq.common.config import EXPERIENCE_PORT, LearnerConfig
    from rlmq.learners.learner import main

    try:
        cfg = LearnerConfig(
            run=run,
            coordinator=coordinator,
            broadcast=broadcast,
            rank=rank,
            world_size=world_size,
            master_addr=master_addr,
            master_port=master_port,
            advertise_host=advertise_host,
            experience_port=EXPERIENCE_PORT + rank if experience_port is None else experience_port,
            metrics_port=metrics_port,
            device=device,
            torch_threads=torch_threads,
            bind_host=bind_host,
            collective_timeout_s=collective_timeout,
            announce_file=announce,
            credit_timeout_min_s=credit_timeout_min,
            master_fd=master_fd,
            checkpoint_dir=checkpoint_dir,
            experience_fd=experience_fd,
            experience_ipc=experience_ipc,
            keys_dir=keys,
            failpoint=failpoint,
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    raise typer.Exit(main(cfg, stop))


def actor(
    name: Annotated[str, opt("Actor name; a trailing -N picks its seed stream.", "NAME")] = "actor-0",
    coordinator: Coord = "tcp://127.0.0.1:5555",
    broadcast: Broadcast = "tcp://127.0.0.1:5556",
    metrics_port: MetricsPort = 0,
    bind_host: BindHost = "*",
    announce: Announce = "",
    max_steps: Annotated[int | None, opt("Stop after this many env steps.", "MAX_STEPS")] = None,
    keys: KeysDir = "",
    key_name: Annotated[
        str,
        opt(
            "Its key in --keys (NAME.key_secret); default: its own name; `actors`: the "
            "fleet's key for actors of any name (`rlmq keys --kubernetes`).",
            "KEY_NAME",
        ),
    ] = "",
    device: Annotated[str, opt(ACTOR_DEVICE_HELP, "DEVICE")] = "auto",
    env_threads: Annotated[
        int,
        opt(
            "Threads stepping an env that has them (Atari's); 0: the cores this process is given.", "ENV_THREADS", min=0
        ),
    ] = 0,
) -> None:
    """Run one actor."""
    require_keys(keys, key_name or name, False, key_name or name)
    stop = start_service(name)
    from rlmq.actors.actor import main
    from rlmq.common.config import ActorConfig

    try:
        cfg = ActorConfig(
            name=name,
            coordinator=coordinator,
            broadcast=broadcast,
            metrics_port=metrics_port,
            bind_host=bind_host,
            announce_file=announce,
            max_steps=max_steps,
            keys_dir=keys,
            key_name=key_name,
            device=device,
            env_threads=env_threads,
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    raise typer.Exit(main(cfg, stop))
