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


class DictBandit(gym.Env[dict[str, np.ndarray], np.int64]):
    """A Dict observation of one image and one vector (`pixel_bandit:DictBandit`): PixelBandit's
    image beside a float32 vector that one-hot codes a second bit. The action 2 · side + bit earns
    1, so a policy must read both: a random one earns 4 of 16, one that reads the image alone 8."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict(
            {"image": gym.spaces.Box(0, 255, SHAPE, np.uint8), "vector": gym.spaces.Box(-1, 1, (2,), np.float32)}
        )
        self.action_space = gym.spaces.Discrete(4)
        self.image = PixelBandit()
        self.bit, self.steps = 0, 0

    def _observe(self) -> dict[str, np.ndarray]:
        vector = np.zeros(2, np.float32)
        vector[self.bit] = 1.0
        return {"image": self.image._observe(), "vector": vector}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        self.image.reset(seed=None if seed is None else seed + 1)
        self.bit, self.steps = int(self.np_random.integers(2)), 0
        return self._observe(), {}

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        reward = float(int(action) == 2 * self.image.side + self.bit)
        self.image.step(0)
        self.bit, self.steps = int(self.np_random.integers(2)), self.steps + 1
        return self._observe(), reward, self.steps >= EPISODE_STEPS, False, {}


# Registered on import, as third-party packages register their ids: `--env pixel_bandit:PixelBandit/Dict-v0`.
gym.register(id="PixelBandit/Dict-v0", entry_point=DictBandit)
