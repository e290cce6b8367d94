"""The `rlmq` command: one service per subcommand (what a container runs), `up`, `status` and
`check` (the container probe).

Service options can also come from `RLMQ_*` environment variables (shown in `--help`). Service
modules are imported inside each command, so an actor never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from rlmq.common.service import (
    EXIT_FAILED,
    EXIT_USAGE,
    StopFlag,
    configure_logging,
    install_signal_handlers,
    limit_threads,
    open_files_as_allowed,
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="rlmq: message-queue actor-learner reinforcement learning.",
)


def _opt(help: str, env: str | None = None, **kw: Any) -> Any:
    return typer.Option(help=help, envvar=f"RLMQ_{env}" if env else None, **kw)


Run = Annotated[str, _opt("Run id: names the run's keys in Redis.", "RUN")]
Coord = Annotated[str, _opt("Coordinator control endpoint.", "COORDINATOR")]
Broadcast = Annotated[str, _opt("Coordinator broadcast (PUB) endpoint.", "BROADCAST")]
MetricsPort = Annotated[int, _opt("Port of /metrics (0: any free port, -1: none).", "METRICS_PORT")]
Announce = Annotated[str, _opt("Write the ports this process bound to this JSON file.", "ANNOUNCE", hidden=True)]
Fd = Annotated[int, _opt("A listening socket inherited from rlmq up (-1: bind here).", hidden=True)]
BindHost = Annotated[str, _opt("Address this process's listeners bind (*: every interface).", "BIND_HOST")]
RedisPasswordFile = Annotated[
    str,
    _opt(
        "A file holding the Redis password (kept out of process listings; `rlmq up` writes one for its private Redis).",
        "REDIS_PASSWORD_FILE",
    ),
]
KeysDir = Annotated[
    str,
    _opt(
        "The run's CURVE keys (`rlmq keys`): every ZeroMQ socket authenticated and encrypted; empty: plain ZeroMQ.",
        "KEYS_DIR",
    ),
]
RedisOutage = Annotated[
    float, _opt("Ride out a Redis outage this long (s), retrying; then exit 1.", "REDIS_OUTAGE_S", min=0.0)
]
ACTOR_DEVICE_HELP = (
    "Where actors run a convolutional policy (Atari's): auto (a GPU if there is one), cpu, cuda "
    "or cuda:N. Other policies run in NumPy on the CPU."
)


# What redis-py's `from_url` accepts. A bare `HOST:PORT` is the usual slip; redis-py's own error
# for it is a traceback from deep inside the first connection.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def _require_redis_url(url: str | None) -> None:
    """Exit 2 with one line naming the fix unless `url` is a URL redis-py can use (or None)."""
    if url is None:
        return
    reason = ""
    if url.startswith(REDIS_SCHEMES):
        import redis

        try:
            redis.ConnectionPool.from_url(url)  # parses only; connects on first use
            return
        except (ValueError, TypeError) as exc:  # a port or db that is not a number, a bad query
            reason = f" ({exc})"
    typer.echo(
        f"error: --redis-url {url} is not a Redis URL{reason}: use redis://HOST:PORT/DB "
        "(rediss:// for TLS, unix:///PATH for a socket)",
        err=True,
    )
    raise typer.Exit(EXIT_USAGE)


def _require_keys(keys_dir: str, name: str | None, serves: bool, process: str) -> None:
    """Exit 2 with one line naming the fix unless `keys_dir` (if given) holds the keys `process` reads."""
    if not keys_dir:
        return
    from rlmq.common.security import load_keys

    try:
        load_keys(Path(keys_dir), name, serves)
    except (OSError, ValueError) as exc:
        typer.echo(
            f"error: --keys {keys_dir}: {exc}; copy the bundle `rlmq keys` made for {process} "
            f"(KEYS/bundles/{process}/) to this host and give its path",
            err=True,
        )
        raise typer.Exit(EXIT_USAGE) from None


def _start(name: str, torch_threads: int = 1) -> StopFlag:
    limit_threads(torch_threads)
    open_files_as_allowed()
    log = configure_logging(name)
    stop = StopFlag()
    install_signal_handlers(stop, log)
    return stop


@app.command()
def coordinator(
    run: Run = "default",
    redis_url: Annotated[str, _opt("Redis URL.", "REDIS_URL")] = "redis://127.0.0.1:6379/0",
    run_config: Annotated[Path | None, _opt("Run config file (TOML or JSON).", "RUN_CONFIG")] = None,
    control_bind: Annotated[str, _opt("Bind address of the control ROUTER.", "CONTROL_BIND")] = "tcp://*:5555",
    broadcast_bind: Annotated[str, _opt("Bind address of the broadcast PUB.", "BROADCAST_BIND")] = "tcp://*:5556",
    metrics_port: MetricsPort = 0,
    bind_host: BindHost = "*",
    announce: Announce = "",
    control_fd: Fd = -1,
    broadcast_fd: Fd = -1,
    redis_outage_s: RedisOutage = 30.0,
    redis_password_file: RedisPasswordFile = "",
    keys: KeysDir = "",
    tensorboard_dir: Annotated[
        str, _opt("Write the run's TensorBoard curves here (needs rlmq[tensorboard]); empty: none.", "TENSORBOARD_DIR")
    ] = "",
    tensorboard_max_mb: Annotated[
        float, _opt("The curves stop growing past this size (MiB).", "TENSORBOARD_MAX_MB", min=1.0)
    ] = 256.0,
    failpoint: Annotated[str, _opt("Tests only: die at this named point.", "FAILPOINT", hidden=True)] = "",
) -> None:
    """Run the coordinator: registration, Redis state and weights, PBT, end of run."""
    _require_redis_url(redis_url)
    _require_keys(keys, None, True, "coordinator")
    stop = _start("coordinator")
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


@app.command()
def learner(
    run: Run = "default",
    coordinator: Coord = "tcp://127.0.0.1:5555",
    broadcast: Broadcast = "tcp://127.0.0.1:5556",
    rank: Annotated[int, _opt("This learner's rank.", "RANK")] = 0,
    world_size: Annotated[int, _opt("Number of learner ranks.", "WORLD_SIZE")] = 1,
    master_addr: Annotated[
        str,
        _opt(
            "Rank 0's address (torch.distributed); auto: rank 0's advertised address, from the coordinator.",
            "MASTER_ADDR",
        ),
    ] = "auto",
    master_port: Annotated[int, _opt("Rendezvous port.", "MASTER_PORT")] = 29500,
    advertise_host: Annotated[
        str,
        _opt(
            "Address actors and the other ranks reach this learner at; auto: the one "
            "this host reaches the coordinator from.",
            "ADVERTISE_HOST",
        ),
    ] = "auto",
    experience_port: Annotated[
        int | None, _opt("Experience ROUTER port (0: any); default 5557 + rank.", "EXPERIENCE_PORT")
    ] = None,
    experience_fd: Fd = -1,
    experience_ipc: Annotated[
        str,
        _opt(
            "Serve experience on this Unix socket path (ipc://) instead of TCP: for actors on this host.",
            "EXPERIENCE_IPC",
        ),
    ] = "",
    metrics_port: MetricsPort = 0,
    device: Annotated[str, _opt("auto, cpu or cuda[:N].", "DEVICE")] = "auto",
    torch_threads: Annotated[int, _opt("Intra-op threads.", "TORCH_THREADS", min=1)] = 1,
    bind_host: BindHost = "*",
    announce: Announce = "",
    master_fd: Fd = -1,
    collective_timeout: Annotated[
        float, _opt("Seconds a collective may wait for a peer rank.", "COLLECTIVE_TIMEOUT_S", min=1.0)
    ] = 30.0,
    credit_timeout_min: Annotated[
        float,
        _opt(
            "A credit unused this long, or 4x the slowest recent rollout if longer, is taken back (its actor died).",
            "CREDIT_TIMEOUT_MIN_S",
            min=0.01,
        ),
    ] = 0.5,
    checkpoint_dir: Annotated[
        str,
        _opt(
            "Where learner checkpoints go (each rank under rank{r}/) and a restarted world resumes from; empty: none.",
            "CHECKPOINT_DIR",
        ),
    ] = "",
    keys: KeysDir = "",
    failpoint: Annotated[str, _opt("Tests only: die at this named point.", hidden=True)] = "",
    restart: Annotated[
        bool,
        _opt(
            "Start this rank again whenever its world is lost (a peer died or was cut off): "
            "with --checkpoint-dir, the new world resumes where the old one was."
        ),
    ] = False,
) -> None:
    """Run one learner rank."""
    _require_keys(keys, f"learner-{rank}", True, f"learner-{rank}")
    stop = _start(f"learner-{rank}", torch_threads)
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


@app.command()
def actor(
    name: Annotated[str, _opt("Actor name; a trailing -N picks its seed stream.", "NAME")] = "actor-0",
    coordinator: Coord = "tcp://127.0.0.1:5555",
    broadcast: Broadcast = "tcp://127.0.0.1:5556",
    metrics_port: MetricsPort = 0,
    bind_host: BindHost = "*",
    announce: Announce = "",
    max_steps: Annotated[int | None, _opt("Stop after this many env steps.", "MAX_STEPS")] = None,
    keys: KeysDir = "",
    key_name: Annotated[
        str,
        _opt(
            "Its key in --keys (NAME.key_secret); default: its own name; `actors`: the "
            "fleet's key for actors of any name (`rlmq keys --kubernetes`).",
            "KEY_NAME",
        ),
    ] = "",
    device: Annotated[str, _opt(ACTOR_DEVICE_HELP, "DEVICE")] = "auto",
    env_threads: Annotated[
        int,
        _opt(
            "Threads stepping an env that has them (Atari's); 0: the cores this process is given.", "ENV_THREADS", min=0
        ),
    ] = 0,
) -> None:
    """Run one actor."""
    _require_keys(keys, key_name or name, False, key_name or name)
    stop = _start(name)
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


@app.command()
def up(
    actors: Annotated[int, _opt("Actor processes.", min=1)] = 4,
    learners: Annotated[
        int | None, _opt("Learner processes (one torch.distributed world); default 1, or the resumed run's.", min=1)
    ] = None,
    env: Annotated[str | None, _opt("Gymnasium id or package.module:EnvClass.")] = None,
    algo: Annotated[str | None, _opt("Algorithm: ppo, sac, td3 or dqn.")] = None,
    total_steps: Annotated[int | None, _opt("Env-step budget (all actors together).")] = None,
    target_return: Annotated[
        float | None, _opt("Stop when the mean of the last 100 episodes (config: return_window) reaches it.")
    ] = None,
    num_envs: Annotated[int | None, _opt("Vector-env slots per actor.")] = None,
    seed: Annotated[int | None, _opt("Seed.")] = None,
    population: Annotated[int | None, _opt("Members trained together (by --method).")] = None,
    method: Annotated[
        str | None,
        _opt(
            "How a population trains: pbt (copies and perturbations), cem (CEM-RL: SAC or TD3 actors drawn "
            "around a shared critic) or dvd (SAC or TD3 with a shared critic and DvD's diversity term)."
        ),
    ] = None,
    checkpoint_every: Annotated[
        float | None,
        _opt(
            "Seconds between learner checkpoints (0: only at the end); "
            "a restarted learner world resumes from the newest."
        ),
    ] = None,
    config: Annotated[
        Path | None,
        _opt(
            "Run config file (TOML or JSON); flags override it. Default: the shipped "
            "config for --env and --algo, if any (`rlmq configs`)."
        ),
    ] = None,
    redis_url: Annotated[str | None, _opt("Use this Redis; default: start a private one.")] = None,
    run_dir: Annotated[Path | None, _opt("Where config, checkpoint, metrics and plots go.")] = None,
    torch_threads: Annotated[int, _opt("Intra-op threads per learner.", min=1)] = 1,
    device: Annotated[
        str, _opt("Learners' device: auto (a GPU each if there are enough), cpu, cuda.", "DEVICE")
    ] = "auto",
    actor_device: Annotated[str, _opt(ACTOR_DEVICE_HELP, "ACTOR_DEVICE")] = "auto",
    redis_outage_s: RedisOutage = 30.0,
    bind_host: Annotated[str, _opt("Address every process of the run listens on (*: every interface).")] = "127.0.0.1",
    collective_timeout: Annotated[
        float, _opt("Seconds a learners' collective may wait for a peer rank.", min=1.0)
    ] = 30.0,
    transport: Annotated[
        str, _opt("How experience goes from actors to learners: ipc (Unix sockets) or tcp (loopback).")
    ] = "ipc",
    secure: Annotated[
        bool,
        typer.Option(
            "--secure/--insecure",
            help="CURVE on every ZeroMQ socket, with keys made "
            "for the run in RUN_DIR/keys; --insecure: plain ZeroMQ, for a trusted "
            "single host only.",
        ),
    ] = True,
    resume: Annotated[
        Path | None,
        _opt(
            "Continue the run in this run directory where it was (stopped, finished or "
            "crashed), with a new --total-steps or --target-return if given."
        ),
    ] = None,
) -> None:
    """Train locally: coordinator, learners and actors as separate processes (`rlmq.train` in Python)."""
    options = {name: value for name, value in locals().items() if name != "redis_outage_s"}  # plan's, by name
    from rlmq.cli import launch

    _require_redis_url(redis_url)
    try:
        up_cfg = launch.plan(**options)
        code = launch.run_up(up_cfg, redis_outage_s)
    except launch.Refused as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exc.code) from None
    raise typer.Exit(code)


@app.command("eval")
def eval_(
    source: Annotated[
        Path,
        typer.Argument(
            help="A run directory of `rlmq up` (its checkpoint.pt, else its newest "
            "learner checkpoint), or a checkpoint file."
        ),
    ] = Path("runs/latest"),
    episodes: Annotated[int, _opt("Episodes to play.", min=1)] = 20,
    member: Annotated[int | None, _opt("Population member (default: the best).")] = None,
    sample: Annotated[bool, _opt("Sample actions as the actors do, rather than the deterministic policy.")] = False,
    seed: Annotated[int, _opt("Episode i starts from reset(seed=SEED + i).")] = 0,
    video: Annotated[
        Path | None, _opt("Write the first episode to this .mp4 or .gif (envs that render rgb_array).")
    ] = None,
) -> None:
    """Play a checkpoint's policy for N episodes; print the mean return ± std and episode lengths."""
    from rlmq.cli.evaluate import evaluate, load_checkpoint, summary

    try:
        checkpoint = load_checkpoint(source, member)
        result = evaluate(checkpoint, episodes, seed, deterministic=not sample, video=video)
    except ValueError as exc:  # envs.EnvError included
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    typer.echo(summary(checkpoint, result, deterministic=not sample))
    if video is not None:
        typer.echo(f"  video of episode 0: {video}")


@app.command()
def export(
    source: Annotated[
        Path,
        typer.Argument(
            help="A run directory of `rlmq up` (its checkpoint.pt, else its newest "
            "learner checkpoint), or a checkpoint file."
        ),
    ] = Path("runs/latest"),
    out: Annotated[Path, _opt("The TorchScript file to write.")] = Path("policy.pt"),
    member: Annotated[int | None, _opt("Population member (default: the best).")] = None,
) -> None:
    """Write the deterministic policy as TorchScript that runs with plain torch (README: five lines)."""
    from rlmq.cli.evaluate import load_checkpoint
    from rlmq.cli.export import export as write

    try:
        checkpoint = load_checkpoint(source, member)
        written = write(checkpoint, out)
    except (ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    parts = checkpoint.spec.obs_parts
    takes = f"; it takes one tensor per part: {', '.join(f'{p.name} {p.dtype}[N, *{list(p.shape)}]' for p in parts)}"
    size = checkpoint.run_config.core_state_size
    state = (
        f"; it takes and returns each slot's {checkpoint.run_config.core} state, float32[N, {size}], "
        "zeros where an episode starts"
    )
    typer.echo(
        f"wrote {written}: {checkpoint.run_config.algo} on {checkpoint.run_config.env_id}, "
        f"member {checkpoint.member}, version {checkpoint.version}{takes if parts else ''}{state if size else ''}"
    )


@app.command()
def configs() -> None:
    """List the shipped run configs: `rlmq up --env ID --algo A` uses the one for that pair."""
    from rlmq.cli.shipped import shipped

    rows = shipped()
    typer.echo(f"{'env':28} {'algo':5} {'file':26} summary")
    for s in rows:
        note = s.summary if s.population == 1 else f"(--config only: a population of {s.population}) {s.summary}"
        typer.echo(f"{s.env_id:28} {s.algo:5} {s.path.name:26} {note}")
    if rows:
        typer.echo(f"in {rows[0].path.parent}")


@app.command()
def keys(
    directory: Annotated[Path, typer.Argument(help="Where the run's keys go (made mode 0700; each file 0600).")],
    learners: Annotated[int, _opt("Learner ranks to make a client key for.", min=0)] = 1,
    actors: Annotated[
        int | None,
        _opt(
            "Actors to make a client key for (actor-0, actor-1, ...); default 1, or 0 "
            "with --kubernetes (its actors share the fleet's key).",
            min=0,
        ),
    ] = None,
    kubernetes: Annotated[
        bool,
        _opt(
            "Also the fleet's key for actors of any name, a Redis password and a "
            "kustomization of the Secrets deploy/k8s mounts (DIRECTORY: "
            "deploy/k8s/base/keys)."
        ),
    ] = False,
) -> None:
    """Make a run's CURVE keys: the servers' pair, one pair per learner and actor, the allow-list."""
    from rlmq.cli.keys import make_keys

    actors = (0 if kubernetes else 1) if actors is None else actors
    try:
        make_keys(directory, learners, actors, kubernetes)
    except FileExistsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    made = "the fleet's actor key, a Redis password and their Secrets' kustomization" if kubernetes else ""
    typer.echo(
        f"wrote the keys of {learners} learner(s) and {actors} actor(s){' and ' + made if made else ''} "
        f"to {directory}; {directory}/bundles/<process>/ holds one process's own (copy it to the host that "
        "runs it, as its --keys)"
    )


@app.command("redis")
def redis_server(
    data_dir: Annotated[Path, _opt("Where its data (append-only file), config and password go.")] = Path("redis"),
    port: Annotated[int, _opt("Port.")] = 6379,
    bind: Annotated[str, _opt("Address it listens on: loopback serves a coordinator on this host.")] = "127.0.0.1",
) -> None:
    """Run a Redis server for services started one by one (the one rlmq installs): persistent, with
    a password made at its first start in DATA_DIR/password, for the coordinator's
    --redis-password-file."""
    from rlmq.cli.redis_server import exec_standalone

    exec_standalone(data_dir, port, bind)


@app.command()
def status(
    run_dir: Annotated[Path, _opt("Run directory of an `rlmq up` run.")] = Path("runs/latest"),
    redis_url: Annotated[str | None, _opt("Redis URL (default: from the run directory).", "REDIS_URL")] = None,
    run: Annotated[str | None, _opt("Run id (default: from the run directory).", "RUN")] = None,
    redis_password_file: RedisPasswordFile = "",
) -> None:
    """Print a run's live status from Redis."""
    from rlmq.cli.status import show_status

    _require_redis_url(redis_url)
    raise typer.Exit(show_status(run_dir, redis_url, run, redis_password_file))


@app.command()
def check(
    metrics_port: Annotated[int, _opt("The service's fixed /metrics port.", "METRICS_PORT")],
    max_age: Annotated[float | None, _opt("Also fail when the service loop last ran longer ago (s).")] = None,
    redis_url: Annotated[str | None, _opt("Also fail when this Redis does not answer PING.")] = None,
    timeout: Annotated[float, _opt("Seconds to wait for each answer.")] = 2.0,
    redis_password_file: RedisPasswordFile = "",
) -> None:
    """Probe a service in this container (readiness, liveness): exit 0, or 1 with what to fix."""
    from rlmq.cli.check import CheckFailed, run_check
    from rlmq.common.redis_urls import with_password

    if metrics_port <= 0:
        typer.echo(
            "error: rlmq check needs the service's fixed metrics port: pass --metrics-port "
            "or set RLMQ_METRICS_PORT (and start the service with the same port, not 0)",
            err=True,
        )
        raise typer.Exit(EXIT_USAGE)
    _require_redis_url(redis_url)
    try:
        redis_url = None if redis_url is None else with_password(redis_url, redis_password_file)
        typer.echo(run_check(metrics_port, max_age, redis_url, timeout))
    except OSError as exc:
        typer.echo(f"error: --redis-password-file {redis_password_file}: {exc.strerror or exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except CheckFailed as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None


def main() -> None:
    app()
