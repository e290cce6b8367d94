"""Steps a vector env with a NumPy policy and fills time-major rollout buffers. No sockets here.

Gymnasium 1.x vector envs reset a finished slot on the *next* step (that step ignores the action
and returns the first observation of the new episode with reward 0). Such steps are marked
``valid = False``: learners skip them, and they are not counted as env steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from rlmq.common.config import EnvSpec
from rlmq.common.envs import flatten_obs
from rlmq.common.models import NumpyPolicy
from rlmq.common.wire import Rollout


@dataclass
class Episodes:
    """Episodes finished since the last `drain`."""

    returns: list[float]
    lengths: list[int]

    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        out = np.asarray(self.returns, np.float64), np.asarray(self.lengths, np.int64)
        self.returns, self.lengths = [], []
        return out


class Collector:
    def __init__(self, env: gym.vector.VectorEnv, spec: EnvSpec, rollout_length: int, seed: int) -> None:
        self.env, self.spec, self.length = env, spec, rollout_length
        self.num_envs = env.num_envs
        self.rng = np.random.default_rng(seed)
        self.obs = flatten_obs(env.reset(seed=seed)[0], self.num_envs)
        self.prev_done = np.zeros(self.num_envs, dtype=bool)
        self.episode_return = np.zeros(self.num_envs, dtype=np.float64)
        self.episode_length = np.zeros(self.num_envs, dtype=np.int64)
        self.episodes = Episodes([], [])
        self.clip = (
            (np.asarray(spec.action_low, np.float32), np.asarray(spec.action_high, np.float32))
            if spec.action_kind == "continuous" and spec.action_low
            else None
        )

    def collect(self, policy: NumpyPolicy, member: int, version: int, actor: str) -> Rollout:
        """One rollout of `rollout_length` vector steps under `policy`."""
        steps, n = self.length, self.num_envs
        obs = np.empty((steps + 1, n, self.spec.obs_dim), np.float32)
        action_shape = (steps, n) if policy.discrete else (steps, n, self.spec.action_dim)
        actions = np.empty(action_shape, np.int64 if policy.discrete else np.float32)
        logprobs = np.empty((steps, n), np.float32)
        rewards = np.empty((steps, n), np.float32)
        terminated = np.empty((steps, n), bool)
        truncated = np.empty((steps, n), bool)
        valid = np.empty((steps, n), bool)
        env, rng = self.env, self.rng
        for t in range(steps):
            obs[t] = self.obs
            action, logp = policy.act(self.obs, rng)
            env_action = action if self.clip is None else np.clip(action, *self.clip)
            next_obs, reward, term, trunc, _ = env.step(env_action)
            actions[t], logprobs[t], rewards[t] = action, logp, reward
            terminated[t], truncated[t] = term, trunc
            np.logical_not(self.prev_done, out=valid[t])
            self.episode_return += reward
            self.episode_length += valid[t]
            done = np.logical_or(term, trunc, out=self.prev_done)
            if done.any():
                self.finish_episodes(done)
            self.obs = flatten_obs(next_obs, n)
        obs[steps] = self.obs
        return Rollout(
            member=member, policy_version=version, actor=actor, obs=obs, actions=actions,
            logprobs=logprobs, rewards=rewards, terminated=terminated, truncated=truncated, valid=valid,
        )  # fmt: skip

    def finish_episodes(self, done: np.ndarray) -> None:
        self.episodes.returns.extend(self.episode_return[done].tolist())
        self.episodes.lengths.extend(self.episode_length[done].tolist())
        self.episode_return[done] = 0.0
        self.episode_length[done] = 0
