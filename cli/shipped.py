"""The run configs rlmq ships (`configs/*.toml`, the package `rlmq.configs`), found by the env and
algorithm they set: `rlmq up --env ID --algo A` without `--config` uses the one for that pair, as
RL-Zoo picks its hyperparameters per environment and algorithm; `rlmq configs` lists them.

A config that trains a population (PBT) is an example to name with --config, never picked: the
pair's single-agent config is, and `--population` turns PBT on over it.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rlmq.common.config import RunConfig

DEFAULTS = RunConfig()


@dataclass(frozen=True)
class Shipped:
    path: Path
    env_id: str
    algo: str
    population: int
    summary: str  # the file's first comment line


def shipped() -> list[Shipped]:
    """Every shipped config, by file name."""
    found = []
    for entry in sorted(resources.files("rlmq.configs").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".toml"):
            continue
        text = entry.read_text()
        fields = tomllib.loads(text)
        comments = [line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")]
        found.append(
            Shipped(
                path=Path(str(entry)).resolve(),
                env_id=fields.get("env_id", DEFAULTS.env_id),
                algo=fields.get("algo", DEFAULTS.algo),
                population=fields.get("population", 1),
                summary=comments[0] if comments else "",
            )
        )
    return found


def pick(env_id: str, algo: str) -> Shipped | None:
    """The shipped single-agent config for this env and algorithm, if there is one."""
    matches = [s for s in shipped() if (s.env_id, s.algo, s.population) == (env_id, algo, 1)]
    if len(matches) > 1:  # a packaging mistake, caught by tests/test_shipped_configs.py
        raise ValueError(f"several shipped configs for {env_id} + {algo}: {', '.join(m.path.name for m in matches)}")
    return matches[0] if matches else None
