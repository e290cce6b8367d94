"""A policy played for whole episodes, as RL-Zoo and CleanRL report theirs: `rlmq eval` plays a
checkpoint's, and the run's own evaluator (coordinator/evaluator.py) the weights it judges.

Episode i starts from `env.reset(seed=seed + i)`, so two policies (or rlmq and SB3 in
benchmarks/bench_zoo.py) meet the same episodes. Deterministic: the likeliest action, the
Gaussian's mean, SAC's tanh of the mean, TD3's action without noise (`NumpyPolicy.mode`); sampled:
the actors' own sampling, colored exploration noise included. Observation statistics in the
weights apply as they did on the actors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlmq.common import envs
from rlmq.common.models import NumpyPolicy
from rlmq.common.noise import ColoredNoise, colored_noise_for
from rlmq.common.schema import EnvSpec

MAX_EPISODE_STEPS = 1_000_000  # an env that never ends an episode must not hang an evaluation
MAX_SLOTS = 16  # episodes played side by side (`play_side_by_side`)


@dataclass(frozen=True)
class Evaluation:
    returns: list[float]
    lengths: list[int]

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))


class Sampler:
    """How the actors act in one env slot, episode by episode: the deterministic action
    (`NumpyPolicy.mode`), or their own sampling, where a policy with a `noise_color` draws colored
    noise, a new sequence each episode (actors/collector.py); a recurrent policy steps from a state
    zeroed at each episode's start."""

    def __init__(
        self, policy: NumpyPolicy, spec: EnvSpec, rng: np.random.Generator, deterministic: bool = False
    ) -> None:
        self.policy, self.spec, self.rng, self.deterministic = policy, spec, rng, deterministic
        self.noise: ColoredNoise | None = None
        self.state = np.zeros((1, policy.state_size), np.float32) if policy.state_size else None

    def new_episode(self, time_limit: int | None) -> None:
        if not self.deterministic:
            self.noise = colored_noise_for(self.policy.noise_color, self.spec, 1, time_limit, self.rng)
        if self.state is not None:
            self.state[:] = 0.0

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        if self.deterministic:
            return self.policy.mode(obs, self.state)
        return self.policy.act(obs, self.rng, None if self.noise is None else self.noise.sample(), self.state)[0]


def play(
    env_id: str,
    act: Any,
    episodes: int,
    seed: int,
    clip: tuple[np.ndarray, np.ndarray] | None = None,
    frames: list[np.ndarray] | None = None,
    new_episode: Callable[[int | None], None] | None = None,
    frame_stack: int | None = None,
) -> Evaluation:
    """`episodes` episodes of `act` (observations [1, ...] → actions [1, ...]) in a one-slot env,
    episode i from seed + i; with `frames`, the first episode's rgb_array frames are appended.
    `new_episode` hears the env's time limit at each reset; `frame_stack` is the run's
    (`envs.make_vector_env`)."""
    render_mode = "rgb_array" if frames is not None else None
    env = envs.make_vector_env(env_id, 1, render_mode=render_mode, frame_stack=frame_stack)
    if frames is not None and env.render_mode != "rgb_array":
        env.close()
        raise ValueError(f"--video needs an env that renders rgb_array frames; {env_id} does not")
    returns, lengths = [], []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            if new_episode is not None:
                new_episode(getattr(env.spec, "max_episode_steps", None))
            total, steps, done = 0.0, 0, False
            while not done and steps < MAX_EPISODE_STEPS:
                if frames is not None and episode == 0:
                    frames.append(np.asarray(env.render()[0]))  # type: ignore[index]
                action = act(obs)
                obs, reward, terminated, truncated, _ = env.step(action if clip is None else np.clip(action, *clip))
                total, steps = total + float(reward[0]), steps + 1
                done = bool(terminated[0] or truncated[0])
            returns.append(total)
            lengths.append(steps)
    finally:
        env.close()
    return Evaluation(returns, lengths)


def play_policy(
    policy: NumpyPolicy,
    env_id: str,
    spec: EnvSpec,
    episodes: int,
    seed: int,
    deterministic: bool,
    frames: list[np.ndarray] | None = None,
    frame_stack: int | None = None,
) -> Evaluation:
    """`play` for an actors' policy: its deterministic action, or its own sampling (seeded by `seed`)."""
    sampler = Sampler(policy, spec, np.random.default_rng(seed), deterministic)
    return play(env_id, sampler, episodes, seed, clip_of(spec), frames, sampler.new_episode, frame_stack)


def clip_of(spec: EnvSpec) -> tuple[np.ndarray, np.ndarray] | None:
    if not spec.action_low:
        return None
    return np.asarray(spec.action_low, np.float32), np.asarray(spec.action_high, np.float32)


def play_side_by_side(
    policy: NumpyPolicy,
    env_id: str,
    spec: EnvSpec,
    episodes: int,
    seed: int,
    deterministic: bool,
    slots: int = MAX_SLOTS,
    frame_stack: int | None = None,
) -> Evaluation:
    """`episodes` episodes in waves of up to `slots` played side by side in one vector env (the
    actors' own), each slot's first episode of a wave counted: one batched forward pass a step
    instead of one per episode. Wave k resets the env with seed + k·slots (a vector env seeds its
    slots from it); a recurrent policy's slots start each wave from zero states."""
    width = min(slots, episodes)
    env = envs.make_vector_env(env_id, width, frame_stack=frame_stack)
    rng = np.random.default_rng(seed)
    clip = clip_of(spec)
    returns: list[float] = []
    lengths: list[int] = []
    try:
        while len(returns) < episodes:
            wanted = min(width, episodes - len(returns))
            obs, _ = env.reset(seed=seed + len(returns))
            noise = (
                None
                if deterministic
                else colored_noise_for(
                    policy.noise_color, spec, width, getattr(env.spec, "max_episode_steps", None), rng
                )
            )
            total, steps = np.zeros(width), np.zeros(width, np.int64)
            playing = np.arange(width) < wanted
            state = np.zeros((width, policy.state_size), np.float32) if policy.state_size else None
            while playing.any() and steps.max() < MAX_EPISODE_STEPS:
                action = (
                    policy.mode(obs, state)
                    if deterministic
                    else policy.act(obs, rng, None if noise is None else noise.sample(), state)[0]
                )
                obs, reward, terminated, truncated, _ = env.step(action if clip is None else np.clip(action, *clip))
                total += np.where(playing, reward, 0.0)
                steps += playing
                playing &= ~(np.asarray(terminated) | np.asarray(truncated))
            returns += total[:wanted].tolist()
            lengths += steps[:wanted].tolist()
    finally:
        env.close()
    return Evaluation(returns, lengths)
