"""What the `rlmq` commands' options share: their help and `RLMQ_*` environment variables, and
the checks that turn a bad value into one line naming the fix before any service starts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from rlmq.common.service import EXIT_USAGE


def opt(help: str, env: str | None = None, **kw: Any) -> Any:
    return typer.Option(help=help, envvar=f"RLMQ_{env}" if env else None, **kw)


Run = Annotated[str, opt("Run id: names the run's keys in Redis.", "RUN")]
Coord = Annotated[str, opt("Coordinator control endpoint.", "COORDINATOR")]
Broadcast = Annotated[str, opt("Coordinator broadcast (PUB) endpoint.", "BROADCAST")]
MetricsPort = Annotated[int, opt("Port of /metrics (0: any free port, -1: none).", "METRICS_PORT")]
Announce = Annotated[str, opt("Write the ports this process bound to this JSON file.", "ANNOUNCE", hidden=True)]
Fd = Annotated[int, opt("A listening socket inherited from rlmq up (-1: bind here).", hidden=True)]
BindHost = Annotated[str, opt("Address this process's listeners bind (*: every interface).", "BIND_HOST")]
RedisPasswordFile = Annotated[
    str,
    opt(
        "A file holding the Redis password (kept out of process listings; `rlmq up` writes one for its private Redis).",
        "REDIS_PASSWORD_FILE",
    ),
]
KeysDir = Annotated[
    str,
    opt(
        "The run's CURVE keys (`rlmq keys`): every ZeroMQ socket authenticated and encrypted; empty: plain ZeroMQ.",
        "KEYS_DIR",
    ),
]
RedisOutage = Annotated[
    float, opt("Ride out a Redis outage this long (s), retrying; then exit 1.", "REDIS_OUTAGE_S", min=0.0)
]
ACTOR_DEVICE_HELP = (
    "Where actors run a convolutional policy (Atari's): auto (a GPU if there is one), cpu, cuda "
    "or cuda:N. Other policies run in NumPy on the CPU."
)


# What redis-py's `from_url` accepts. A bare `HOST:PORT` is the usual slip; redis-py's own error
# for it is a traceback from deep inside the first connection.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def require_redis_url(url: str | None) -> None:
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


def require_keys(keys_dir: str, name: str | None, serves: bool, process: str) -> None:
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
