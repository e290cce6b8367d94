"""rlmq from Python: `train` runs what `rlmq up` runs and returns its summary; `load_policy` gives a
run's policy as a function of observations, as `rlmq eval` plays it.

    import rlmq
    summary = rlmq.train(env="CartPole-v1", target_return=475, actors=2)
    policy = rlmq.load_policy(summary.run_dir)
    action = policy(observation)

The CLI is a layer over the same code (cli/launch.py), so a config, a flag or an error means here
what it means there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Every `rlmq.*` import runs this module first (a service's, `rlmq check`'s): it imports nothing
# heavy at the top, and RunConfig only when asked for (`rlmq.RunConfig`).
if TYPE_CHECKING:
    import numpy as np

    from rlmq.common.config import RunConfig

__all__ = ["Policy", "RunConfig", "RunFailed", "RunSummary", "load_policy", "train"]


def __getattr__(name: str) -> Any:
    if name == "RunConfig":
        from rlmq.common.config import RunConfig

        return RunConfig
    raise AttributeError(f"module 'rlmq' has no attribute {name!r}")


class RunFailed(RuntimeError):
    """A run that started and failed (its log lines say why); `code` is `rlmq up`'s exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class RunSummary:
    """How a run ended: the run directory's summary.json (`details`), its main figures as fields."""

    run_dir: Path
    success: bool  # the target reached (judged by the run's own evaluation), or no target set
    outcome: str
    env_steps: int
    mean_return: float | None  # the best member's last `return_window` episodes, as its actors reported them
    evaluated_return: float | None  # the run's own evaluation of its final policy (coordinator/judge.py)
    train_wall_s: float | None
    details: dict[str, Any]

    @classmethod
    def read(cls, run_dir: Path) -> RunSummary:
        details = json.loads((run_dir / "summary.json").read_text())
        evaluation = details.get("evaluation") or {}
        return cls(
            run_dir=run_dir,
            success=bool(details["success"]),
            outcome=str(details["outcome"]),
            env_steps=int(details["env_steps"]),
            mean_return=details.get("mean_return_last_100"),
            evaluated_return=evaluation.get("mean_return"),
            train_wall_s=details.get("train_wall_s"),
            details=details,
        )


def train(
    config: RunConfig | str | Path | None = None,
    *,
    actors: int = 4,
    learners: int | None = None,
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
    run_dir: str | Path | None = None,
    torch_threads: int = 1,
    device: str = "auto",
    actor_device: str = "auto",
    bind_host: str = "127.0.0.1",
    collective_timeout: float = 30.0,
    transport: str = "ipc",
    secure: bool = True,
    resume: str | Path | None = None,
    redis_outage_s: float = 30.0,
) -> RunSummary:
    """Train as `rlmq up` does, with its options by the same names (`rlmq up --help`): `config` is a
    RunConfig or a TOML/JSON file, and the keywords override it. Blocks until the run ends, printing
    its progress; Ctrl-C stops it warmly (then KeyboardInterrupt). A run that ends without reaching
    its target returns (`success` False); one that cannot start raises ValueError naming the fix,
    one that fails RunFailed."""
    options = {name: value for name, value in locals().items() if name != "redis_outage_s"}  # plan's, by name
    for name in ("config", "run_dir", "resume"):  # a path may come as a string
        options[name] = Path(options[name]) if isinstance(options[name], str) else options[name]
    from rlmq.cli import launch
    from rlmq.common.service import EXIT_INTERRUPTED, EXIT_OK, EXIT_TARGET_MISSED

    try:
        up_cfg = launch.plan(**options)
        code = launch.run_up(up_cfg, redis_outage_s)
    except launch.Refused as exc:
        raise ValueError(str(exc)) from None
    if code == EXIT_INTERRUPTED:
        raise KeyboardInterrupt(f"run stopped; its results so far are in {up_cfg.run_dir}")
    if code not in (EXIT_OK, EXIT_TARGET_MISSED):
        raise RunFailed(f"the run in {up_cfg.run_dir} failed (exit {code}): its log above says why", code)
    return RunSummary.read(up_cfg.run_dir)


class Policy:
    """A run's policy: observations in, actions out, as `rlmq eval` plays it (observation
    normalization included). One observation gives one action; a batch [N, *shape] gives N. A Dict
    or Tuple observation is given as the env gives it (a batch: each part with N rows). A recurrent
    policy (`state_size` > 0) also takes each env slot's `state` ([state_size], or
    [N, state_size] for a batch: `initial_state`), advanced in place; zero a slot's state where its
    episode starts."""

    def __init__(self, run_dir: Path, member: int | None, deterministic: bool, seed: int) -> None:
        import numpy as np

        from rlmq.cli.evaluate import load_checkpoint, policy_of
        from rlmq.common.episodes import Sampler

        checkpoint = load_checkpoint(run_dir, member)
        self.run_config, self.spec, self.member = checkpoint.run_config, checkpoint.spec, checkpoint.member
        self.version = checkpoint.version
        self._policy = policy_of(checkpoint)
        self.state_size = self._policy.state_size
        self._rng = np.random.default_rng(seed)
        self._deterministic = deterministic
        # Colored exploration noise is drawn one slot at a time, a sequence per slot.
        self._sampler = (
            None if deterministic or not self._policy.noise_color else Sampler(self._policy, self.spec, self._rng)
        )

    def initial_state(self, slots: int | None = None) -> np.ndarray:
        """Zeros: the state of a recurrent policy's env slot at an episode's start ([state_size],
        or [slots, state_size])."""
        import numpy as np

        return np.zeros((self.state_size,) if slots is None else (slots, self.state_size), np.float32)

    def __call__(self, obs: Any, state: np.ndarray | None = None) -> np.ndarray:
        import numpy as np

        from rlmq.common.composite import pack

        if self.spec.obs_parts:  # as the actors' envs give it: one record of the parts' bytes
            first = self.spec.obs_parts[0]
            rows = np.shape(obs[first.name if isinstance(obs, Mapping) else 0])
            obs = pack(obs, self.spec.obs_parts, None if rows == first.shape else rows[0])
        batch = np.asarray(obs)
        single = batch.shape == tuple(self.spec.obs_shape)
        if single:
            batch = batch[None]
        if (state is None) != (self.state_size == 0):
            raise ValueError(
                "a recurrent policy takes each slot's state (policy.initial_state(N)), a stateless one none"
                if self.state_size
                else "this policy has no recurrent state: call it without one"
            )
        rows_of_state = None if state is None else (state[None] if single else state)
        if rows_of_state is not None and rows_of_state.shape != (len(batch), self.state_size):
            raise ValueError(f"state {state.shape}: one row of {self.state_size} per observation")  # type: ignore[union-attr]
        if self._deterministic:
            actions = self._policy.mode(batch, rows_of_state)
        elif self._sampler is not None:
            actions = np.stack([self._sampler(row[None]) for row in batch])
        else:
            actions = self._policy.act(batch, self._rng, None, rows_of_state)[0]
        return actions[0] if single else actions


def load_policy(run_dir: str | Path, member: int | None = None, deterministic: bool = True, seed: int = 0) -> Policy:
    """The policy a run trained (`rlmq up`'s checkpoint.pt, else its newest learner checkpoint):
    the best member's unless `member` is given; the likeliest action unless `deterministic` is
    False, then sampled as the actors sample (seeded by `seed`). ValueError naming what is wrong."""
    return Policy(Path(run_dir), member, deterministic, seed)
