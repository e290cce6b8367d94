"""CEM-RL's generations as the coordinator runs them (`method = "cem"`, Pourchot & Sigaud 2019).

The population's actors are drawn from a search distribution over their weights (coordinator/cem.py),
and the learners train the first `cem.trained` of each draw with the shared critic meanwhile. A
generation is due when every member has played `cem.fitness_episodes` whole episodes with its draw
(episodes begun under an earlier draw are not evidence of it: `Weights.copied_by` names the draw);
the distribution then moves towards the fittest members' actors as they are now (the trained ones
have moved), and the next draw is made. The first generation draws around member 0's first
published actor.

Each generation is logged with the distribution it draws from to the stream PBT's decisions go to,
under the same ids, before it is applied (`Population.next_generation`), so a coordinator that dies
in between applies it when it restarts, once. The draw is not stored: it is made again, the same,
from the logged distribution and a generator seeded by the run's seed and the id.
"""

from __future__ import annotations

import time

import numpy as np

from rlmq.common import wire
from rlmq.common.config import RunConfig
from rlmq.coordinator import cem
from rlmq.coordinator.records import LoggedGeneration
from rlmq.coordinator.store import RunStore


class Generations:
    def __init__(self, store: RunStore, run_config: RunConfig) -> None:
        self.store, self.run_config, self.cfg = store, run_config, run_config.cem
        self.size = run_config.population
        self.drawn: wire.Generation | None = None  # the last draw made, kept for the ticks that resend it

    def due(
        self, applied: int, returns: dict[int, list[float]], weights: dict[int, wire.Weights], run_env_steps: int
    ) -> tuple[LoggedGeneration, cem.Distribution] | None:
        """The generation to log after the one `applied` (0: none yet), with the distribution it
        draws from; None until every member has its fitness (`returns`, newest first, as evidence
        of its current draw) and an actor published (`weights`)."""
        elites: tuple[int, ...] = ()
        if applied == 0:
            if 0 not in weights:
                return None
            dist, fitness = cem.initial(cem.flatten(dict(weights[0].params)), self.cfg), {}
        else:
            k = self.cfg.fitness_episodes
            if any(m not in weights or len(returns.get(m, [])) < k for m in range(self.size)):
                return None
            scores = [float(np.mean(returns[m][:k])) for m in range(self.size)]
            actors = np.stack([cem.flatten(dict(weights[m].params)) for m in range(self.size)])
            before = self.store.distribution(applied)
            if before is None:
                raise RuntimeError(f"generation {applied} is applied but its distribution is not in Redis")
            dist = cem.update(before, actors, scores, self.cfg)
            fitness = {str(m): score for m, score in enumerate(scores)}
            elites = tuple(int(m) for m in cem.ranked(scores)[: self.cfg.elites])
        entry = LoggedGeneration(
            id=applied + 1,
            generation=dist.generation + 1,
            fitness=fitness,
            elites=elites,
            trained=tuple(range(self.cfg.trained_members(self.size))),
            noise=dist.noise,
            spread=float(np.sqrt(dist.variance).mean()),
            run_env_steps=run_env_steps,
            time=time.time(),
        )
        return entry, dist

    def message(self, entry: LoggedGeneration, like: wire.Weights) -> wire.Generation:
        """What the learners take for `entry`: every member's actor drawn from the distribution
        logged with it (the same draw however often it is made), in `like`'s parameters."""
        if self.drawn is not None and self.drawn.id == entry.id:
            return self.drawn
        dist = self.store.distribution(entry.id)
        if dist is None:
            raise RuntimeError(f"generation {entry.id} is logged without its distribution")
        rng = np.random.default_rng([self.run_config.seed, entry.id])
        actors = cem.sample(dist, self.size, rng)
        self.drawn = wire.Generation(
            id=entry.id,
            actors=tuple(cem.unflatten(actor, dict(like.params)) for actor in actors),
            trained=tuple(m in entry.trained for m in range(self.size)),
        )
        return self.drawn
