"""A third-party env as a user would bring one (`pixel_bandit:PixelBandit`): image-shaped uint8
observations that a policy must read to earn its reward.

Each step lights either the left or the right half of channel 0 (255) over noise in channel 1; the
action that names the lit side earns 1. Episodes are 16 steps: a random policy earns 8 on average,
one that reads the image 16.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

SHAPE = (6, 6, 2)
EPISODE_STEPS = 16


class PixelBandit(gym.Env[np.ndarray, np.int64]):
    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.side, self.steps = 0, 0

    def _observe(self) -> np.ndarray:
        obs = np.zeros(SHAPE, np.uint8)
        half = SHAPE[1] // 2
        obs[:, half * self.side : half * (self.side + 1), 0] = 255
        obs[..., 1] = self.np_random.integers(0, 64, SHAPE[:2], dtype=np.uint8)
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.side, self.steps = int(self.np_random.integers(2)), 0
        return self._observe(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = float(int(action) == self.side)
        self.side, self.steps = int(self.np_random.integers(2)), self.steps + 1
        return self._observe(), reward, self.steps >= EPISODE_STEPS, False, {}


class StackedPixelBandit(gym.wrappers.FrameStackObservation):
    """PixelBandit's frames stacked 4 deep ([4, 6, 6, 2]), as Atari's preprocessing stacks its own:
    a new episode's stack repeats its first frame (gymnasium's "reset" padding)."""

    def __init__(self) -> None:
        super().__init__(PixelBandit(), stack_size=4)
