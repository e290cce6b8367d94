"""Partially observed classic control: the velocities hidden, so that only a policy with memory
can act well (SB3-Contrib's `MaskVelocityWrapper`; RL-Zoo's ids).

`CartPoleNoVel-v1` is CartPole-v1 with the cart's and the pole's velocities (observation indices 1
and 3) zeroed; `PendulumNoVel-v1` is Pendulum-v1 with the angular velocity (index 2) zeroed. Both
are registered when rlmq's env module is imported (every rlmq process that builds an env), with
CartPole's native vector env behind the vector id. `MaskVelocity` wraps any env the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv, CartPoleVectorEnv
from gymnasium.envs.classic_control.pendulum import PendulumEnv

CARTPOLE_VELOCITIES = (1, 3)  # cart velocity, pole angular velocity
PENDULUM_VELOCITIES = (2,)  # angular velocity


class MaskVelocity(gym.ObservationWrapper[np.ndarray, Any, np.ndarray]):
    """Zeroes the observation's entries at `indices` (the velocities)."""

    def __init__(self, env: gym.Env[np.ndarray, Any], indices: Sequence[int]) -> None:
        super().__init__(env)
        self.indices = list(indices)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        masked = np.array(observation, copy=True)
        masked[..., self.indices] = 0
        return masked


class MaskVelocityVector(gym.vector.VectorObservationWrapper):
    """`MaskVelocity` for a vector env's batch of observations."""

    def __init__(self, env: gym.vector.VectorEnv, indices: Sequence[int]) -> None:
        super().__init__(env)
        self.indices = list(indices)

    def observations(self, observations: np.ndarray) -> np.ndarray:
        masked = np.array(observations, copy=True)
        masked[..., self.indices] = 0
        return masked


def cartpole_no_vel(**kwargs: Any) -> gym.Env[np.ndarray, Any]:
    return MaskVelocity(CartPoleEnv(**kwargs), CARTPOLE_VELOCITIES)


def cartpole_no_vel_vector(num_envs: int = 1, **kwargs: Any) -> gym.vector.VectorEnv:
    return MaskVelocityVector(CartPoleVectorEnv(num_envs=num_envs, **kwargs), CARTPOLE_VELOCITIES)


def pendulum_no_vel(**kwargs: Any) -> gym.Env[np.ndarray, Any]:
    return MaskVelocity(PendulumEnv(**kwargs), PENDULUM_VELOCITIES)


def register() -> None:
    """Register the ids (again is a no-op: another package, RL-Zoo's, may have registered them)."""
    if "CartPoleNoVel-v1" not in gym.registry:
        gym.register(
            id="CartPoleNoVel-v1",
            entry_point=cartpole_no_vel,
            vector_entry_point=cartpole_no_vel_vector,
            max_episode_steps=500,
            reward_threshold=475.0,
        )
    if "PendulumNoVel-v1" not in gym.registry:
        gym.register(id="PendulumNoVel-v1", entry_point=pendulum_no_vel, max_episode_steps=200)
