"""Gymnasium environments: build the fastest vector env an id offers, and describe its spaces.

`env_id` is a registered id (``CartPole-v1``), ``package.module:EnvClass``, or Gymnasium's own
``package.module:EnvId`` (the import registers the id, as `gymnasium.make` reads it). A registered
id with a native vector entry point (CartPole's ``CartPoleVectorEnv``, many times faster than a
SyncVectorEnv; benchmarks/LOG.md §1) uses it, and ALE ids ale-py's own vector env (common/atari.py).
Every vector env here resets slots the Gymnasium 1.x default way (next-step autoreset), which the
actor's `valid` mask relies on.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from rlmq.common import atari, masked
from rlmq.common.algorithms import ALGORITHMS
from rlmq.common.composite import PackedObservations, travel_dtype
from rlmq.common.images import resolve_encoder
from rlmq.common.schema import MAX_OBS_DIMS, EnvSpec

masked.register()  # CartPoleNoVel-v1, PendulumNoVel-v1: velocities hidden (common/masked.py)


class EnvError(ValueError):
    """An environment rlmq cannot run; the message says why and what to use instead."""


def _env_class(env_id: str) -> Callable[[], gym.Env] | type[gym.vector.VectorEnv] | None:
    if ":" not in env_id:
        return None
    module_name, attr = env_id.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may raise anything at import, SyntaxError included
        raise EnvError(
            f"cannot import {module_name} for env {env_id!r}: {_one_line(exc)}. Fix the module, "
            "or the env id (package.module:EnvClass, importable on PYTHONPATH)"
        ) from exc
    found = getattr(module, attr, None)
    if isinstance(found, type) and issubclass(found, (gym.Env, gym.vector.VectorEnv)):
        return found
    return None  # gymnasium's own "module:RegisteredId" form: the import registered it


# Gymnasium's env families whose packages come as an extra of rlmq (pyproject.toml), by entry point.
EXTRAS = {"gymnasium.envs.box2d": "box2d", "gymnasium.envs.mujoco": "mujoco", "ale_py": "atari"}
# Env families whose ids a package registers when imported (or by its `register_envs()`), by the
# ids' namespace: (module, extra of rlmq).
NAMESPACES = {"ALE": ("ale_py", "atari"), "MinAtar": ("minatar.gym", "minatar")}


def _register_namespace(env_id: str) -> None:
    """Import what registers `env_id`'s namespace (ALE/…, MinAtar/…); EnvError naming the extra
    to install if it is missing."""
    namespace = env_id.split("/", 1)[0] if "/" in env_id and ":" not in env_id else ""
    if namespace not in NAMESPACES or env_id in gym.registry:
        return
    module_name, extra = NAMESPACES[namespace]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EnvError(
            f'env {env_id!r} needs the {extra} extra: pip install "rlmq[{extra}]" '
            f"(it could not import {module_name}: {_one_line(exc)})"
        ) from exc
    register = getattr(module, "register_envs", None)
    if env_id not in gym.registry and callable(register):
        register()


def registered_id(env_id: str) -> str:
    """The id in the registry: ``package.module:EnvId`` names ``EnvId``, which the import of
    ``package.module`` (by `_env_class`) registered."""
    return env_id.split(":", 1)[1] if ":" in env_id else env_id


def _extra(entry_point: str) -> str:
    return next((extra for prefix, extra in EXTRAS.items() if entry_point.startswith(prefix)), "")


def _one_line(exc: BaseException) -> str:
    """`Type: message` on one line, so that a service logs and `rlmq up` prints one line."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def make_vector_env(
    env_id: str,
    num_envs: int,
    render_mode: str | None = None,
    threads: int = 1,
    native: bool = True,
    frame_stack: int | None = None,
) -> gym.vector.VectorEnv:
    """`num_envs` slots of `env_id`; a `render_mode` (e.g. rgb_array for `rlmq eval --video`) is
    passed to a registered id's envs. An ALE id steps in ale-py's own vector env on `threads` C++
    threads, unless it renders or `native` is False: then through gymnasium's wrappers
    (common/atari.py); its observations stack `frame_stack` frames (RunConfig.frame_stack: None
    for the preprocessing's 4). Only an ALE id's preprocessing stacks frames: any other env takes
    None or 1."""
    given, env_class = env_id, _env_class(env_id)
    if frame_stack is not None and frame_stack != 1 and (env_class is not None or not _native_atari(env_id)):
        raise EnvError(
            f"frame_stack = {frame_stack}: only ALE ids' preprocessing stacks frames, and {env_id} is "
            "not one; leave frame_stack out, or stack them in your env (gymnasium.wrappers.FrameStackObservation)"
        )
    stack = atari.PREPROCESSING.frame_stack if frame_stack is None else frame_stack
    if env_class is not None:
        try:
            if isinstance(env_class, type) and issubclass(env_class, gym.vector.VectorEnv):
                env: gym.vector.VectorEnv = env_class(num_envs=num_envs)  # type: ignore[call-arg]
            else:
                env = gym.vector.SyncVectorEnv([env_class] * num_envs)  # type: ignore[list-item]
        except Exception as exc:  # the user's constructor, or spaces SyncVectorEnv refuses
            raise EnvError(
                f"env {env_id!r}: building it raised {_one_line(exc)}. Fix the env class "
                "(its constructor must take no arguments; a VectorEnv's only num_envs)"
            ) from exc
    else:
        _register_namespace(env_id)
        env_id = registered_id(env_id)
        try:
            spec = gym.spec(env_id)
        except gym.error.Error as exc:
            if ":" in given:  # the module imported (else _env_class said so)
                module_name, attr = given.split(":", 1)
                raise EnvError(
                    f"unknown env {given!r}: {module_name} has no gymnasium.Env or VectorEnv "
                    f"class named {attr!r}, nor registered an id {attr!r}"
                ) from exc
            raise EnvError(
                f"unknown env {env_id!r} ({exc}); registered ids: `python -c "
                f"'import gymnasium; gymnasium.pprint_registry()'`"
            ) from exc
        mode = "vector_entry_point" if spec.vector_entry_point and render_mode is None else "sync"
        kwargs: dict[str, Any] = {} if render_mode is None else {"render_mode": render_mode}
        try:
            if atari.is_atari(spec) and native and render_mode is None:
                env = atari.native_env(spec, num_envs, threads, stack)
            else:
                if atari.is_atari(spec):  # frames skipped by the preprocessing
                    mode, kwargs["frameskip"], kwargs["wrappers"] = "sync", 1, atari.wrappers(stack)
                env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode, **kwargs)
        except Exception as exc:  # e.g. gymnasium's DependencyNotInstalled for MuJoCo or Box2D ids
            extra = _extra(str(spec.entry_point))
            if extra and isinstance(exc, (ImportError, gym.error.DependencyNotInstalled)):
                raise EnvError(
                    f'env {env_id!r} needs the {extra} extra: pip install "rlmq[{extra}]" '
                    f"(it could not import what it needs: {_one_line(exc)})"
                ) from exc
            raise EnvError(
                f"env {env_id!r} is registered but cannot be built: {_one_line(exc)}. "
                "Install what it needs, or use another --env"
            ) from exc
    autoreset = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if autoreset != AutoresetMode.NEXT_STEP:
        env.close()
        raise EnvError(f"{env_id}: rlmq needs next-step autoreset, the env uses {autoreset}")
    if isinstance(env.single_observation_space, gym.spaces.Dict | gym.spaces.Tuple):
        try:
            return PackedObservations(env, env_id)
        except ValueError as exc:
            env.close()
            raise EnvError(str(exc)) from None
    return env


def make_lanes(
    env_id: str, num_envs: int, threads: int = 1, split: bool = True, frame_stack: int | None = None
) -> list[gym.vector.VectorEnv]:
    """An actor's `num_envs` slots as vector envs over consecutive slots ("lanes"): two halves of
    the native Atari env (`threads` split between them), which steps in halves, so that the actor
    chooses one lane's actions while the other's emulators run; one env otherwise, or unless `split`."""
    if num_envs < 2 or not split or not _native_atari(env_id):
        return [make_vector_env(env_id, num_envs, threads=threads, frame_stack=frame_stack)]
    half = num_envs // 2
    return [
        make_vector_env(env_id, half, threads=max(1, threads // 2), frame_stack=frame_stack),
        make_vector_env(env_id, num_envs - half, threads=max(1, threads - threads // 2), frame_stack=frame_stack),
    ]


def _native_atari(env_id: str) -> bool:
    """Whether `env_id` is an ALE id (so `make_vector_env` builds the native env); False where
    it is not registered (`make_vector_env` says why)."""
    if ":" in env_id:
        return False
    try:
        _register_namespace(env_id)
        return atari.is_atari(gym.spec(env_id))
    except (EnvError, gym.error.Error):
        return False


def describe(env: gym.vector.VectorEnv, env_id: str) -> EnvSpec:
    obs = {**observation_spec(env.single_observation_space, env_id), "frame_stack": frame_stack(env)}
    if isinstance(env, PackedObservations):
        obs["obs_parts"] = env.parts
    action_space = env.single_action_space
    if isinstance(action_space, gym.spaces.Discrete):
        return EnvSpec(**obs, action_kind="discrete", action_dim=int(action_space.n))
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        low, high = action_space.low.astype(float), action_space.high.astype(float)
        bounded = bool(np.isfinite(low).all() and np.isfinite(high).all())
        return EnvSpec(
            **obs,
            action_kind="continuous",
            action_dim=int(action_space.shape[0]),
            action_low=tuple(low.tolist()) if bounded else (),
            action_high=tuple(high.tolist()) if bounded else (),
        )
    raise EnvError(f"{env_id}: action space {action_space} is not supported; use Discrete or a 1-D Box")


def frame_stack(env: gym.vector.VectorEnv) -> int:
    """The frames a FrameStackObservation in the slots' wrappers stacks, or the native Atari env
    (1: none, or not visible: the slots of an async or custom vector env are out of reach, and then
    storing whole stacks costs memory, never correctness)."""
    if atari.is_native(env):
        return int(env.single_observation_space.shape[0])  # type: ignore[index]
    slot = next(iter(getattr(env, "envs", [])), None)
    while isinstance(slot, gym.Wrapper):
        if isinstance(slot, gym.wrappers.FrameStackObservation):
            return int(slot.stack_size)
        slot = slot.env
    return 1


def observation_spec(space: gym.Space[Any], env_id: str) -> dict[str, Any]:
    """The EnvSpec fields of an observation space: a Box of at most MAX_OBS_DIMS dims, its dtype
    as it travels (floats as float32, other integers as int64), or a Discrete one from 0."""
    if isinstance(space, gym.spaces.Discrete):
        if int(space.start) != 0:
            raise EnvError(
                f"{env_id}: Discrete observations must start at 0, not {space.start} "
                "(wrap the env: TransformObservation)"
            )
        return {"obs_shape": (), "obs_dtype": "int64", "obs_categories": int(space.n)}
    if not isinstance(space, gym.spaces.Box) or not 1 <= len(space.shape) <= MAX_OBS_DIMS:
        raise EnvError(
            f"{env_id}: observation space {space} is not a Box of 1 to {MAX_OBS_DIMS} dimensions, a "
            "Discrete, or a Dict or Tuple of Boxes; wrap it (e.g. gymnasium.wrappers.FlattenObservation)"
        )
    return {"obs_shape": tuple(int(d) for d in space.shape), "obs_dtype": travel_dtype(np.dtype(space.dtype))}


def probe(env_id: str, algo: str | None = None, encoder: str = "auto", frame_stack: int | None = None) -> EnvSpec:
    """The spec of `env_id` (its observations stacking `frame_stack` frames: `make_vector_env`),
    from a throwaway one-slot vector env; with `algo`, checked against the action spaces that
    algorithm supports (the error names the ones that fit) and the observations its `encoder`
    (RunConfig.encoder) takes."""
    env = make_vector_env(env_id, 1, frame_stack=frame_stack)
    try:
        spec = describe(env, env_id)
    finally:
        env.close()
    if algo is not None and spec.action_kind not in ALGORITHMS[algo].action_kinds:
        fitting = [a.name for a in ALGORITHMS.values() if spec.action_kind in a.action_kinds]
        raise EnvError(
            f"{algo} needs {' or '.join(ALGORITHMS[algo].action_kinds)} actions and {env_id} has "
            f"{spec.action_kind} ones: use --algo {' or '.join(fitting)}"
        )
    if algo is not None:
        try:
            resolve_encoder(encoder, spec, ALGORITHMS[algo].takes_images)
        except ValueError as exc:
            raise EnvError(f"{env_id} with {algo}: {exc}") from exc
    return spec
