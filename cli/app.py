"""The `rlmq` command: one service per subcommand (what a container runs: services.py), and the
user's: `up`, `eval`, `export`, `configs`, `keys`, `redis`, `status` and `check` (the container probe).

Service options can also come from `RLMQ_*` environment variables (shown in `--help`). Modules are
imported inside each command, so an actor never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlmq.cli import services
from rlmq.cli.options import ACTOR_DEVICE_HELP, RedisOutage, RedisPasswordFile, opt, require_redis_url
from rlmq.common.service import EXIT_FAILED, EXIT_USAGE

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="rlmq: message-queue actor-learner reinforcement learning.",
)
app.command()(services.coordinator)
app.command()(services.learner)
app.command()(services.actor)


@app.command()
def up(
    actors: Annotated[int, opt("Actor processes.", min=1)] = 4,
    learners: Annotated[
        int | None, opt("Learner processes (one torch.distributed world); default 1, or the resumed run's.", min=1)
    ] = None,
    env: Annotated[str | None, opt("Gymnasium id or package.module:EnvClass.")] = None,
    algo: Annotated[str | None, opt("Algorithm: ppo, sac, td3 or dqn.")] = None,
    total_steps: Annotated[int | None, opt("Env-step budget (all actors together).")] = None,
    target_return: Annotated[
        float | None, opt("Stop when the mean of the last 100 episodes (config: return_window) reaches it.")
    ] = None,
    num_envs: Annotated[int | None, opt("Vector-env slots per actor.")] = None,
    seed: Annotated[int | None, opt("Seed.")] = None,
    population: Annotated[int | None, opt("Members trained together (by --method).")] = None,
    method: Annotated[
        str | None,
        opt(
            "How a population trains: pbt (copies and perturbations), cem (CEM-RL: SAC or TD3 actors drawn "
            "around a shared critic) or dvd (SAC or TD3 with a shared critic and DvD's diversity term)."
        ),
    ] = None,
    checkpoint_every: Annotated[
        float | None,
        opt(
            "Seconds between learner checkpoints (0: only at the end); "
            "a restarted learner world resumes from the newest."
        ),
    ] = None,
    config: Annotated[
        Path | None,
        opt(
            "Run config file (TOML or JSON); flags override it. Default: the shipped "
            "config for --env and --algo, if any (`rlmq configs`)."
        ),
    ] = None,
    redis_url: Annotated[str | None, opt("Use this Redis; default: start a private one.")] = None,
    run_dir: Annotated[Path | None, opt("Where config, checkpoint, metrics and plots go.")] = None,
    torch_threads: Annotated[int, opt("Intra-op threads per learner.", min=1)] = 1,
    device: Annotated[
        str, opt("Learners' device: auto (a GPU each if there are enough), cpu, cuda.", "DEVICE")
    ] = "auto",
    actor_device: Annotated[str, opt(ACTOR_DEVICE_HELP, "ACTOR_DEVICE")] = "auto",
    redis_outage_s: RedisOutage = 30.0,
    bind_host: Annotated[str, opt("Address every process of the run listens on (*: every interface).")] = "127.0.0.1",
    collective_timeout: Annotated[
        float, opt("Seconds a learners' collective may wait for a peer rank.", min=1.0)
    ] = 30.0,
    transport: Annotated[
        str, opt("How experience goes from actors to learners: ipc (Unix sockets) or tcp (loopback).")
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
        opt(
            "Continue the run in this run directory where it was (stopped, finished or "
            "crashed), with a new --total-steps or --target-return if given."
        ),
    ] = None,
) -> None:
    """Train locally: coordinator, learners and actors as separate processes (`rlmq.train` in Python)."""
    options = {name: value for name, value in locals().items() if name != "redis_outage_s"}  # plan's, by name
    from rlmq.cli import launch

    require_redis_url(redis_url)
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
    episodes: Annotated[int, opt("Episodes to play.", min=1)] = 20,
    member: Annotated[int | None, opt("Population member (default: the best).")] = None,
    sample: Annotated[bool, opt("Sample actions as the actors do, rather than the deterministic policy.")] = False,
    seed: Annotated[int, opt("Episode i starts from reset(seed=SEED + i).")] = 0,
    video: Annotated[
        Path | None, opt("Write the first episode to this .mp4 or .gif (envs that render rgb_array).")
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
    out: Annotated[Path, opt("The TorchScript file to write.")] = Path("policy.pt"),
    member: Annotated[int | None, opt("Population member (default: the best).")] = None,
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
    learners: Annotated[int, opt("Learner ranks to make a client key for.", min=0)] = 1,
    actors: Annotated[
        int | None,
        opt(
            "Actors to make a client key for (actor-0, actor-1, ...); default 1, or 0 "
            "with --kubernetes (its actors share the fleet's key).",
            min=0,
        ),
    ] = None,
    kubernetes: Annotated[
        bool,
        opt(
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
    data_dir: Annotated[Path, opt("Where its data (append-only file), config and password go.")] = Path("redis"),
    port: Annotated[int, opt("Port.")] = 6379,
    bind: Annotated[str, opt("Address it listens on: loopback serves a coordinator on this host.")] = "127.0.0.1",
) -> None:
    """Run a Redis server for services started one by one (the one rlmq installs): persistent, with
    a password made at its first start in DATA_DIR/password, for the coordinator's
    --redis-password-file."""
    from rlmq.cli.redis_server import exec_standalone

    exec_standalone(data_dir, port, bind)


@app.command()
def status(
    # Positional as `rlmq eval`'s and `rlmq export`'s; --run-dir as `rlmq up`'s.
    directory: Annotated[
        Path, typer.Argument(help="Run directory of an `rlmq up` run (or --run-dir).", metavar="RUN_DIR")
    ] = Path("runs/latest"),
    run_dir: Annotated[Path | None, opt("Run directory of an `rlmq up` run.", show_default=False)] = None,
    redis_url: Annotated[str | None, opt("Redis URL (default: from the run directory).", "REDIS_URL")] = None,
    run: Annotated[str | None, opt("Run id (default: from the run directory).", "RUN")] = None,
    redis_password_file: RedisPasswordFile = "",
) -> None:
    """Print a run's live status from Redis."""
    from rlmq.cli.status import show_status

    if run_dir is not None and directory != Path("runs/latest") and directory.resolve() != run_dir.resolve():
        typer.echo(
            f"error: two run directories, {directory} and --run-dir {run_dir}: give one (rlmq status RUN_DIR)",
            err=True,
        )
        raise typer.Exit(EXIT_USAGE)
    require_redis_url(redis_url)
    raise typer.Exit(show_status(run_dir or directory, redis_url, run, redis_password_file))


@app.command()
def check(
    metrics_port: Annotated[int, opt("The service's fixed /metrics port.", "METRICS_PORT")],
    max_age: Annotated[float | None, opt("Also fail when the service loop last ran longer ago (s).")] = None,
    redis_url: Annotated[str | None, opt("Also fail when this Redis does not answer PING.")] = None,
    timeout: Annotated[float, opt("Seconds to wait for each answer.")] = 2.0,
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
    require_redis_url(redis_url)
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
