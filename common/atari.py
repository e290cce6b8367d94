"""Atari (ALE) envs with the standard preprocessing, two ways: ale-py's own vector env, whose C++
threads step the emulators and do the preprocessing (what actors use), and gymnasium's wrappers
around one emulator per slot (`rlmq eval --video`, and the reference the native env is tested
against). Both take the preprocessing from `PREPROCESSING`.

The native env steps in two halves, `send` then `recv`, so that an actor can choose one lane's
actions while another lane's emulators run (actors/collector.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode


@dataclass(frozen=True)
class Preprocessing:
    """Machado et al. 2018's protocol as SB3, CleanRL and EnvPool apply it. Sticky actions are not
    here: they stay as the id registers them (0.25 for the v5 ids)."""

    noop_max: int = 30  # up to this many no-op steps at reset
    frame_skip: int = 4  # emulator frames per step, the last two max-pooled
    screen_size: int = 84  # frames resized to this square, grayscale bytes
    frame_stack: int = 4  # observations stack the last this many frames: [4, 84, 84] (RunConfig.frame_stack)


PREPROCESSING = Preprocessing()


def is_atari(spec: gym.envs.registration.EnvSpec) -> bool:
    """Whether a registered id is an ALE env on the screen (not its RAM)."""
    return str(spec.entry_point).startswith("ale_py") and spec.kwargs.get("obs_type", "rgb") != "ram"


def wrappers(frame_stack: int = PREPROCESSING.frame_stack) -> list[Callable[[gym.Env], gym.Env]]:
    """Gymnasium's preprocessing around an ALE env made with frameskip=1, observations of the last
    `frame_stack` frames ([1, 84, 84] for one, as the native env gives them). Rewards are clipped to
    their sign by the learners (`RunConfig.signs_rewards`), so that actors report real returns.
    OpenCV, which does the resize, gets one thread: its pool ignores OMP_NUM_THREADS, and a
    process's pools fight the other processes' on shared cores (common/service.py)."""
    import cv2  # the atari extra's; imported here so that other envs never load it

    cv2.setNumThreads(1)
    p = PREPROCESSING
    return [
        lambda env: gym.wrappers.AtariPreprocessing(
            env,
            noop_max=p.noop_max,
            frame_skip=p.frame_skip,
            screen_size=p.screen_size,
            terminal_on_life_loss=False,
            grayscale_obs=True,
        ),
        lambda env: gym.wrappers.FrameStackObservation(env, frame_stack),
    ]


def native_settings(
    spec: gym.envs.registration.EnvSpec, frame_stack: int = PREPROCESSING.frame_stack
) -> dict[str, Any]:
    """What `native_env` builds the env with, besides the slots and threads: the id's game, sticky
    actions, action set and frame limit, `PREPROCESSING`, and observations of `frame_stack`
    frames. Rewards come unclipped and a lost life does not end an episode, as on the wrapper
    path; no FIRE at reset (the wrappers press none either). At an episode's start the frames
    before the first are zeros (EnvPool's and SB3's convention), where the wrappers repeat the
    first frame."""
    kwargs: dict[str, Any] = spec.kwargs
    p = PREPROCESSING
    return dict(
        game=kwargs["game"],
        repeat_action_probability=float(kwargs.get("repeat_action_probability", 0.25)),
        full_action_space=bool(kwargs.get("full_action_space", False)),
        max_num_frames_per_episode=int(kwargs.get("max_num_frames_per_episode", 108_000)),
        frameskip=p.frame_skip,
        noop_max=p.noop_max,
        img_height=p.screen_size,
        img_width=p.screen_size,
        stack_num=frame_stack,
        grayscale=True,
        maxpool=True,
        episodic_life=False,
        reward_clipping=False,
        use_fire_reset=False,
        autoreset_mode=AutoresetMode.NEXT_STEP,
    )


def native_env(
    spec: gym.envs.registration.EnvSpec, num_envs: int, threads: int, frame_stack: int = PREPROCESSING.frame_stack
) -> gym.vector.VectorEnv:
    """`num_envs` slots of a registered ALE id in ale-py's `AtariVectorEnv`, stepped by `threads`
    C++ threads (`native_settings`)."""
    from ale_py.vector_env import AtariVectorEnv  # the atari extra's

    settings = native_settings(spec, frame_stack)
    return AtariVectorEnv(settings.pop("game"), num_envs, num_threads=threads, **settings)


def is_native(env: gym.vector.VectorEnv) -> bool:
    """Whether `env` is ale-py's vector env (which steps in halves: `send`, then `recv`)."""
    module = sys.modules.get("ale_py.vector_env")  # not loaded: no env can be one
    return module is not None and isinstance(env, module.AtariVectorEnv)
