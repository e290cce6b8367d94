"""How a population trains: the methods (`RunConfig.method`) and their sections of the run config.

    pbt  members copy and perturb one another (coordinator/pbt.py, Jaderberg et al. 2017)
    cem  CEM-RL: SAC or TD3 actors drawn each generation from a search distribution over their
         weights, half of them trained by one shared critic in between (coordinator/cem.py)
    dvd  SAC or TD3 actors around one shared critic, pushed apart by DvD's diversity term

docs/architecture.md, "Population methods beyond PBT", says how each meets the vectorized update.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlmq.common.algorithms import ALL_TUNABLE, ActorCriticConfig, AlgoConfig, refuse_non_finite, tunable_bounds
from rlmq.common.architecture import ACTIVATIONS, MAX_LAYERS, MAX_WIDTH

METHODS = ("pbt", "cem", "dvd")
PBT_STARTS = ("drawn", "config")


@dataclass(frozen=True)
class HyperRange:
    """Where population-based training may put one hyperparameter."""

    low: float
    high: float
    log: bool = False  # sample log-uniformly (learning rates); otherwise uniformly


def _default_ranges() -> dict[str, HyperRange]:
    # The learning rate only: every algorithm tunes it (configs/pbt-cartpole.toml adds PPO's ent_coef).
    return {"learning_rate": HyperRange(5e-4, 5e-3, log=True)}


@dataclass(frozen=True)
class PBTConfig:
    """Population-based training (coordinator/pbt.py). Used when `RunConfig.population` > 1."""

    interval: int = 20_000  # env steps a member trains between two decisions about it
    selection: str = "truncation"  # truncation | tournament | ttest
    fraction: float = 0.25  # truncation: the bottom fraction copies a member of the top fraction
    tournament_size: int = 3  # tournament: members drawn; the fittest is the one to copy
    elitism: bool = True  # tournament: the fittest member is never replaced
    ttest_confidence: float = 0.95  # ttest: one-sided confidence that the member drawn is fitter
    perturb_factors: tuple[float, ...] = (0.8, 1.25)  # explore: multiply by one of these ...
    resample_probability: float = 0.25  # ... or, with this probability, draw afresh from the range
    param_noise: float = 0.0  # std of Gaussian noise on a copy's policy network, every algorithm's (0: none)
    fitness_episodes: int = 20  # fitness: mean return of the member's last this many episodes
    ranges: dict[str, HyperRange] = field(default_factory=_default_ranges)
    # Where the members' ranged hyperparameters start: "drawn" from `ranges`, each member its own
    # (Jaderberg et al. 2017, fastpbrl); "config", every member at the run's config, as AgileRL's
    # populations start, so that PBT moves away from a tuned config only where a copy pays.
    start: str = "drawn"
    # AgileRL's activation mutation: the hidden activations a member may take (of ACTIVATIONS; none:
    # never mutated) and, at each explore, the probability it switches to another of them.
    activations: tuple[str, ...] = ()
    activation_probability: float = 0.2
    # AgileRL's node mutation: at each explore, with this probability, one hidden layer gains or
    # loses one of `node_steps` units, within [min_width, max_width] (0: widths never change).
    # Every member's MLP layers are then allocated `max_width` units wide, and each uses a prefix
    # of them ("width.i", from the config's hidden sizes at the start): one update for all.
    node_probability: float = 0.0
    node_steps: tuple[int, ...] = (16, 32, 64)
    min_width: int = 16
    max_width: int = 512
    # AgileRL's layer mutation: at each explore, with this probability, a member gains a hidden
    # layer after its last (as wide, starting as the identity) or loses its last, keeping between
    # min_layers and max_layers (0: depth never changes). Every member's MLPs are then allocated
    # `max_layers` hidden layers; one it lacks has width 0 and passes its input through.
    layer_probability: float = 0.0
    min_layers: int = 1
    max_layers: int = 3

    def __post_init__(self) -> None:
        refuse_non_finite(self, "pbt")
        problems = []
        if self.selection not in ("truncation", "tournament", "ttest"):
            problems.append(f"pbt.selection {self.selection!r} is not truncation, tournament or ttest")
        if self.start not in PBT_STARTS:
            problems.append(f"pbt.start {self.start!r} is not {' or '.join(PBT_STARTS)}")
        if not 0.5 <= self.ttest_confidence < 1:
            problems.append("pbt.ttest_confidence must be in [0.5, 1)")
        if self.selection == "ttest" and self.fitness_episodes < 2:
            problems.append("pbt.selection ttest needs pbt.fitness_episodes of at least 2 (a variance)")
        if self.interval < 1 or self.tournament_size < 1 or self.fitness_episodes < 1:
            problems.append("pbt.interval, tournament_size and fitness_episodes must be at least 1")
        if not 0 < self.fraction <= 0.5:
            problems.append("pbt.fraction must be in (0, 0.5]")
        if not self.perturb_factors or min(self.perturb_factors) <= 0:
            problems.append("pbt.perturb_factors must be positive")
        if not 0 <= self.resample_probability <= 1 or self.param_noise < 0:
            problems.append("pbt.resample_probability must be in [0, 1] and param_noise ≥ 0")
        if self.activations and (len(set(self.activations)) < 2 or not set(self.activations) <= set(ACTIVATIONS)):
            problems.append(f"pbt.activations: two or more of {', '.join(ACTIVATIONS)} (none: no mutation)")
        probabilities = (self.activation_probability, self.node_probability, self.layer_probability)
        if not all(0 <= p <= 1 for p in probabilities):
            problems.append("pbt.activation_probability, node_probability and layer_probability must be in [0, 1]")
        if not 1 <= self.min_layers <= self.max_layers <= MAX_LAYERS:
            problems.append(f"pbt: need 1 ≤ min_layers ≤ max_layers ≤ {MAX_LAYERS}")
        if not (self.node_steps and min(self.node_steps) >= 1 and 1 <= self.min_width <= self.max_width <= MAX_WIDTH):
            problems.append(f"pbt: need node_steps ≥ 1 and 1 ≤ min_width ≤ max_width ≤ {MAX_WIDTH}")
        for name, r in self.ranges.items():
            if name not in ALL_TUNABLE:
                problems.append(f"pbt.ranges.{name}: not tunable; tunable are {', '.join(sorted(ALL_TUNABLE))}")
                continue
            lo, hi, lo_inclusive = tunable_bounds(name)
            if not (r.low <= r.high and (lo <= r.low if lo_inclusive else lo < r.low) and r.high <= hi):
                bound = "≤" if lo_inclusive else "<"
                problems.append(f"pbt.ranges.{name}: need {lo:g} {bound} low ≤ high ≤ {hi:g}")
            elif r.log and r.low <= 0:
                problems.append(f"pbt.ranges.{name}: a log range needs low > 0")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class CEMConfig:
    """CEM-RL's cross-entropy method (coordinator/cem.py), with fastpbrl's defaults
    (`CrossEntropyParameters`, `train_td3_cemrl.py`). Used when `RunConfig.method` is "cem"."""

    elites: int = 5  # the fittest members, weighted by log rank, that move the distribution
    initial_variance: float = 1e-2  # σ² of every weight at the start
    initial_noise: float = 1e-2  # ε, added to σ² at each update ...
    final_noise: float = 1e-5  # ... decaying towards this
    noise_decay: float = 0.95  # by this factor per generation
    trained: int | None = None  # members the shared critic trains each generation; None: half (rounded up)
    fitness_episodes: int = 1  # a member's fitness: the mean return of this many whole episodes of its draw

    def __post_init__(self) -> None:
        refuse_non_finite(self, "cem")
        if self.elites < 1 or self.fitness_episodes < 1 or (self.trained is not None and self.trained < 0):
            raise ValueError("cem.elites and cem.fitness_episodes must be at least 1, cem.trained at least 0")
        if min(self.initial_variance, self.initial_noise, self.final_noise) < 0 or not 0 <= self.noise_decay <= 1:
            raise ValueError("cem: variances and noises must be >= 0, noise_decay in [0, 1]")

    def trained_members(self, population: int) -> int:
        return (population + 1) // 2 if self.trained is None else self.trained


@dataclass(frozen=True)
class DvDConfig:
    """DvD's adaptive diversity weight (coordinator/bandit.py). Used when `RunConfig.method` is "dvd"."""

    # A bandit chooses λ between 0 and the section's `diversity_weight` every `interval` env steps of
    # the run, by how the population's best fitness moved after each choice; False: λ stays fixed.
    adaptive: bool = False
    interval: int = 5_000
    fitness_episodes: int = 1  # a member's fitness: the mean return of its newest this many episodes

    def __post_init__(self) -> None:
        if self.interval < 1 or self.fitness_episodes < 1:
            raise ValueError("dvd.interval and dvd.fitness_episodes must be at least 1")


def method_problems(
    method: str,
    section: AlgoConfig,
    population: int,
    pbt: PBTConfig,
    cem: CEMConfig,
    dvd: DvDConfig,
    normalize_obs: bool,
) -> list[str]:
    """What is wrong with training a population of `population` by `method`, each fix named."""
    if method not in METHODS:
        return [f"method must be one of {', '.join(METHODS)}"]
    shared = isinstance(section, ActorCriticConfig) and section.shared_critic
    problems = []
    if (pbt.activations or pbt.node_probability or pbt.layer_probability) and (method != "pbt" or shared):
        problems.append(
            "pbt.activations, node_probability and layer_probability mutate members of method pbt, "
            "each with its own networks"
        )
    if method == "dvd" and not shared:
        problems.append(
            "method dvd trains SAC or TD3 members around one shared critic with DvD's diversity "
            "term: set algo = sac or td3 and, in its section, shared_critic = true and "
            "diversity_weight > 0, or 0 for the same population without the term "
            "(configs/dvd-td3-halfcheetah.toml)"
        )
    weight = section.diversity_weight if isinstance(section, ActorCriticConfig) else 0.0
    if method == "dvd" and dvd.adaptive and weight <= 0:
        problems.append("dvd.adaptive chooses between 0 and the section's diversity_weight: set diversity_weight > 0")
    if method == "cem":
        if not shared:
            problems.append(
                "method cem trains SAC or TD3 actors with one shared critic: set algo = sac or td3 and, "
                "in its section, shared_critic = true (configs/cem-td3-halfcheetah.toml)"
            )
        if population < max(cem.elites, 2) or cem.trained_members(population) > population:
            problems.append(
                f"method cem needs a population of at least 2 and of cem.elites ({cem.elites}), and cem.trained ≤ it"
            )
        if normalize_obs:
            problems.append("method cem draws whole actors, observation statistics apart: set normalize_obs = false")
    return problems
