"""Steps vector envs with a NumPy policy and fills time-major rollout buffers. No sockets here.

Gymnasium 1.x vector envs reset a finished slot on the *next* step (that step ignores the action
and returns the first observation of the new episode with reward 0). Such steps are marked
``valid = False``: learners skip them, and they are not counted as env steps.

A recurrent policy's state is kept per slot across rollouts and weight updates, zeroed before the
first step of each episode (the step after the autoreset step), and each rollout carries the state
it started from, so that a learner can recompute the core over it (learners/cores.py).

When the weights' lineage changes (a PBT copy, a CEM-RL generation) every slot's open episode is
abandoned and the envs reset, so the new weights' episodes start at once: an episode begun under
the old weights is no evidence of the new ones (coordinator `evidence`), and without the restart a
member would spend the rest of it, up to a whole episode, before its first evidence.

An actor's slots may be split into lanes, vector envs over consecutive slots. A lane whose env
steps in halves (the native Atari env: `send` starts a step on its C++ threads, `recv` waits for
it) is stepped while the policy chooses the next lane's actions, so that acting (on a CPU core or
a GPU) and emulating overlap. One lane of an ordinary env steps as it always did.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import gymnasium as gym
import numpy as np

from rlmq.common import atari
from rlmq.common.models import NumpyPolicy
from rlmq.common.noise import ColoredNoise, colored_noise_for
from rlmq.common.schema import EnvSpec, allocate
from rlmq.common.wire import Rollout


class StepsInHalves(Protocol):
    """A vector env that steps in two calls (ale-py's AtariVectorEnv, EnvPool's)."""

    def send(self, actions: np.ndarray) -> None: ...
    def recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]: ...


@dataclass
class Lane:
    """A vector env over the rollout's slots `slots`."""

    env: gym.vector.VectorEnv
    slots: slice
    halves: StepsInHalves | None  # the env, if it steps in halves (else it steps whole, at `recv`)
    pending: np.ndarray | None = None  # the actions for a lane that steps whole


class Collector:
    def __init__(
        self, env: gym.vector.VectorEnv | Sequence[gym.vector.VectorEnv], spec: EnvSpec, rollout_length: int, seed: int
    ) -> None:
        envs = [env] if isinstance(env, gym.vector.VectorEnv) else list(env)
        self.lanes, start = [], 0
        for lane_env in envs:
            halves = cast(StepsInHalves, lane_env) if atari.is_native(lane_env) else None
            self.lanes.append(Lane(lane_env, slice(start, start + lane_env.num_envs), halves))
            start += lane_env.num_envs
        self.spec, self.length, self.num_envs = spec, rollout_length, start
        self.rng = np.random.default_rng(seed)
        # Slot i of the actor is reset with seed + i, whichever lane holds it.
        self.obs = np.concatenate([lane.env.reset(seed=seed + lane.slots.start)[0] for lane in self.lanes])
        self.collected = 0  # rollouts so far: each one's `sequence`
        self.prev_done = np.zeros(self.num_envs, dtype=bool)
        # A recurrent policy's state of each slot (None: a stateless policy's), and the slots whose
        # state is zeroed before the next rollout's first step: a new episode starts there.
        self.core_state: np.ndarray | None = None
        self.starting = np.ones(self.num_envs, dtype=bool)
        self.lineage = 0  # `collect`'s
        self.episode_return = np.zeros(self.num_envs, dtype=np.float64)
        self.episode_length = np.zeros(self.num_envs, dtype=np.int64)
        # The lineage each slot's open episode started under; -1: the slot starts one next.
        self.episode_lineage = np.full(self.num_envs, -1, dtype=np.int64)
        # Rollouts not yet scanned for finished episodes: scanning them together when the actor
        # reports, rather than one by one, keeps that work out of its hot path
        # (benchmarks/LOG.md §1).
        self.unscanned: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.unscanned_lineages: list[int] = []  # each unscanned rollout's
        # Episodes that finished before a restart (`restart_episodes`), not yet taken.
        self.finished_before: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.clip = (
            (np.asarray(spec.action_low, np.float32), np.asarray(spec.action_high, np.float32))
            if spec.action_kind == "continuous" and spec.action_low
            else None
        )
        # Colored exploration noise, once a policy asks for it: one sequence per slot, as long as
        # the env's episodes may be.
        self.noise: ColoredNoise | None = None
        self.time_limit: int | None = getattr(envs[0].spec, "max_episode_steps", None)
        # Where the time of `collect` went, seconds (`take_times`): waiting for the envs to step,
        # and the rest, choosing actions above all.
        self.acting_s = self.env_wait_s = 0.0

    def collect(self, policy: NumpyPolicy, member: int, version: int, actor: str, lineage: int = 0) -> Rollout:
        """One rollout of `rollout_length` vector steps under `policy`: each lane's step t is
        sent once its actions are chosen, and its observations taken at t + 1, in lane order.
        `lineage`: the PBT copy the weights descend from (`Weights.copied_by`); where it changes, a
        recurrent policy's states start again from zeros (another member's memory means nothing to
        the weights that replaced it)."""
        steps = self.length
        arrays = allocate(self.spec, steps, self.num_envs)
        obs, actions, logprobs, rewards = arrays["obs"], arrays["actions"], arrays["logprobs"], arrays["rewards"]
        terminated, truncated, valid = arrays["terminated"], arrays["truncated"], arrays["valid"]
        rng, clip, noise = self.rng, self.clip, self.colored_noise(policy)
        if noise is not None and len(self.lanes) > 1:
            raise ValueError("colored noise needs the slots in one lane")
        if lineage != self.lineage:
            self.core_state, self.lineage = None, lineage
            if self.collected:
                self.restart_episodes()
        state, starting, prev_done = self.memory(policy), self.starting, self.prev_done
        first_state = None
        if state is not None:
            state[starting] = 0.0
            first_state = state.copy()

        def starts_at(t: int, slots: slice) -> np.ndarray:
            """The lane's slots whose episode starts at step t: those whose step t − 1 was an
            autoreset step (done at t − 2)."""
            if t == 0:
                return starting[slots]
            if t == 1:
                return prev_done[slots]
            return terminated[t - 2, slots] | truncated[t - 2, slots]

        # Each lane's views of the arrays, made once here, so that the loop indexes by time alone.
        lanes = []
        for lane in self.lanes:
            s = lane.slots
            lanes.append(
                (lane, obs[:, s], actions[:, s], logprobs[:, s], rewards[:, s], terminated[:, s], truncated[:, s])
            )
        clock, waiting = time.perf_counter, 0.0

        def send(t: int, lane: Lane, obs: np.ndarray, actions: np.ndarray, logprobs: np.ndarray) -> None:
            if state is None:
                action, logp = policy.act(obs[t], rng) if noise is None else policy.act(obs[t], rng, noise.sample())
            else:
                lane_state = state[lane.slots]  # a view: the policy advances it in place
                lane_state[starts_at(t, lane.slots)] = 0.0
                action, logp = policy.act(obs[t], rng, None if noise is None else noise.sample(), lane_state)
            actions[t], logprobs[t] = action, logp
            if clip is not None:
                action = np.clip(action, *clip)
            if lane.halves is not None:
                lane.halves.send(action)
            else:
                lane.pending = action

        obs[0] = self.obs  # in the spec's dtype from here on (a float64 observation becomes float32)
        started = clock()
        for lane, lane_obs, lane_actions, lane_logprobs, *_ in lanes:
            send(0, lane, lane_obs, lane_actions, lane_logprobs)
        for t in range(steps):  # the hot loop: nothing here that can be done once per rollout
            for lane, lane_obs, lane_actions, lane_logprobs, lane_rewards, lane_terminated, lane_truncated in lanes:
                waited = clock()
                halves = lane.halves
                next_obs, reward, term, trunc, _ = halves.recv() if halves is not None else lane.env.step(lane.pending)
                waiting += clock() - waited
                lane_obs[t + 1], lane_rewards[t], lane_terminated[t], lane_truncated[t] = next_obs, reward, term, trunc
                if noise is not None:
                    noise.restart(term | trunc)
                if t + 1 < steps:
                    send(t + 1, lane, lane_obs, lane_actions, lane_logprobs)
        self.acting_s += clock() - started - waiting
        self.env_wait_s += waiting
        self.obs = obs[steps].copy()
        done = terminated | truncated
        valid[0] = ~self.prev_done
        np.logical_not(done[:-1], out=valid[1:])
        self.prev_done = done[-1].copy()
        self.starting = ~valid[-1]
        self.unscanned.append((rewards, valid, done))
        self.unscanned_lineages.append(lineage)
        self.collected += 1
        return Rollout(
            member=member,
            policy_version=version,
            actor=actor,
            sequence=self.collected,
            frame_stack=self.spec.frame_stack,
            core_state=first_state,
            **arrays,
        )

    def restart_episodes(self) -> None:
        """Abandon every slot's open episode and reset the envs. The steps played so far stay
        good data: the last rollout ended on them without a done, so each bootstraps from its
        true next observation, as at a truncation, and no n-step window crosses a rollout's end
        (learners/replay.py). The abandoned episodes are not reported."""
        finished = self.finished_episodes()  # (it takes the list `finished_before` was)
        self.finished_before.append(finished)
        self.episode_return[:] = 0.0
        self.episode_length[:] = 0
        self.episode_lineage[:] = -1
        self.obs = np.concatenate([lane.env.reset()[0] for lane in self.lanes])
        self.prev_done[:] = False  # a reset leaves no autoreset step pending: step 0 is the episode's first
        self.starting[:] = True
        if self.noise is not None:
            self.noise.restart(np.ones(self.num_envs, dtype=bool))

    def memory(self, policy: NumpyPolicy) -> np.ndarray | None:
        """The slots' core state for `policy` (zeros at first), or None for a stateless policy."""
        size = policy.state_size
        if not size:
            self.core_state = None
        elif self.core_state is None or self.core_state.shape[1] != size:
            self.core_state = np.zeros((self.num_envs, size), np.float32)
        return self.core_state

    def take_times(self) -> tuple[float, float]:
        """(acting, waiting for the envs) in seconds since the last call."""
        times = self.acting_s, self.env_wait_s
        self.acting_s = self.env_wait_s = 0.0
        return times

    def close(self) -> None:
        for lane in self.lanes:
            lane.env.close()

    def colored_noise(self, policy: NumpyPolicy) -> ColoredNoise | None:
        """The noise process for `policy`'s `noise_color`, kept across weight updates (a new policy
        object each) so that each slot's sequence runs on; None for white noise."""
        self.noise = colored_noise_for(
            policy.noise_color, self.spec, self.num_envs, self.time_limit, self.rng, self.noise
        )
        return self.noise

    def finished_episodes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(returns, lengths, lineages) of the episodes that ended since the last call, ordered by
        slot, then time, from the rollouts collected since then (one after another, so they
        concatenate), those that finished before a restart first. An episode's lineage is that
        of the rollout it started in (`collect`).

        Each slot's steps, in time order and slot after slot, are cut into segments that start at
        the slot's first step and after each done step; one `np.add.reduceat` sums them all (a
        running sum along time is slower: NumPy does not vectorize accumulation along axis 0;
        benchmarks/LOG.md §1).
        A segment that ends on a done step is a finished episode; the one left open in a slot is
        carried into the next call. Reset steps have reward 0 and are not valid: they add nothing.
        """
        if self.finished_before:
            before, self.finished_before = self.finished_before, []
            parts = [*before, self.finished_episodes()]
            returns, lengths, lineages = (np.concatenate(part) for part in zip(*parts, strict=True))
            return returns, lengths, lineages
        if not self.unscanned:
            return np.zeros(0, np.float64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        rewards, valid, done = (np.concatenate(parts).T for parts in zip(*self.unscanned, strict=True))
        rollout_lineages = np.array(self.unscanned_lineages, np.int64)
        self.unscanned.clear()
        self.unscanned_lineages.clear()
        steps = done.shape[1]
        done = np.ascontiguousarray(done).ravel()  # [slots · steps], slot-major
        starts_here = np.empty_like(done)
        starts_here[1:] = done[:-1]
        starts_here[::steps] = True
        starts = np.flatnonzero(starts_here)
        returns = np.add.reduceat(np.ascontiguousarray(rewards, np.float64).ravel(), starts)
        lengths = np.add.reduceat(np.ascontiguousarray(valid, np.int64).ravel(), starts)
        first = starts % steps == 0  # each slot's first segment continues what the slot carried in
        returns[first] += self.episode_return
        lengths[first] += self.episode_length
        lineages = rollout_lineages[(starts % steps) // self.length]
        lineages[first] = np.where(self.episode_lineage >= 0, self.episode_lineage, lineages[first])
        finished = done[np.append(starts[1:], done.size) - 1]  # the segment's last step is done
        self.episode_return[:] = 0.0  # a slot whose last step was done carries nothing
        self.episode_length[:] = 0
        self.episode_lineage[:] = -1
        open_slots = starts[~finished] // steps
        self.episode_return[open_slots] = returns[~finished]
        self.episode_length[open_slots] = lengths[~finished]
        self.episode_lineage[open_slots] = lineages[~finished]
        return returns[finished], lengths[finished], lineages[finished]
