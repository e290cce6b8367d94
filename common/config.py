"""Frozen configuration: the run (what to learn, travels to every process) and one per service.

Only entry points (the CLI) build these; nothing mutates them. The run config reaches actors and
learners inside `Assign`, so its fields are restricted to what `rlmq.common.wire` can carry.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from rlmq.common.images import ENCODER_CHOICES, resolve_encoder
from rlmq.common.schema import EnvSpec

# Where each tunable hyperparameter must stay whatever a range says: (low, high, low inclusive).
_TUNABLE_BOUNDS = {"gamma": (0.0, 1.0, False), "gae_lambda": (0.0, 1.0, True), "ent_coef": (0.0, 1e9, True),
                   "vf_coef": (0.0, 1e9, True), "tau": (0.0, 1.0, False)}


def hyperparam_problems(hyperparams: dict[str, float]) -> list[str]:
    """What is out of bounds in a member's tunable hyperparameters (e.g. γ > 1), by name."""
    problems = []
    for name, value in hyperparams.items():
        lo, hi, lo_inclusive = _TUNABLE_BOUNDS.get(name, (0.0, 1e9, False))
        if not ((lo <= value if lo_inclusive else lo < value) and value <= hi):
            problems.append(f"{name} = {value:g} outside {'[' if lo_inclusive else '('}{lo:g}, {hi:g}]")
    return problems


def refuse_non_finite(config: Any, section: str = "") -> None:
    """ValueError naming every NaN or infinite float in a config dataclass, nested ones included.

    Checked before any other rule: NaN fails every comparison silently (`nan > 0` is merely False,
    `inf > 0` True), and the wire refuses non-finite floats, so such a run would start and then
    every process would drop its `Assign` and wait forever.
    """
    found = _non_finite(config, section)
    if found:
        raise ValueError("; ".join(f"{name} = {value} is not a finite number" for name, value in found))


def _non_finite(value: Any, name: str) -> list[tuple[str, float]]:
    if isinstance(value, float):
        return [] if math.isfinite(value) else [(name, value)]
    dotted = f"{name}." if name else ""
    if dataclasses.is_dataclass(value):
        return [bad for f in dataclasses.fields(value) for bad in _non_finite(getattr(value, f.name), dotted + f.name)]
    if isinstance(value, dict):
        return [bad for key, item in value.items() for bad in _non_finite(item, f"{dotted}{key}")]
    if isinstance(value, tuple):
        return [bad for i, item in enumerate(value) for bad in _non_finite(item, f"{name}[{i}]")]
    return []


@dataclass(frozen=True)
class PPOConfig:
    """Asynchronous PPO with V-trace targets (see learners/ppo.py)."""

    # Defaults tuned on CartPole-v1 (the default env) for wall time to a return of 475 on a
    # 2-core machine; see benchmarks/RESULTS.md. Many epochs on small fresh batches.
    learning_rate: float = 2e-3
    # Learning rate and clip range decay linearly with the env steps trained on, to
    # `anneal_floor` of their start after `anneal_steps` (0: over `RunConfig.total_steps`).
    anneal_steps: int = 0
    anneal_floor: float = 0.05
    gamma: float = 0.98
    gae_lambda: float = 0.8
    clip_coef: float = 0.2
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    epochs: int = 10
    minibatches: int = 1
    rollouts_per_batch: int = 1  # rollouts each learner rank gathers before one update
    # IMPALA's learner batching: an update takes every rollout a member has queued, up to this
    # many (so more actors feed larger batches at the same policy lag), and its minibatches keep
    # their size: their number grows with the batch. The world takes the largest count any rank
    # has. The credits follow the fleet: one per actor heard from, at least rollouts_in_flight and
    # at most this many (learners/credits.py). 0: exactly rollouts_per_batch, rollouts_in_flight credits.
    max_rollouts_per_batch: int = 0
    # What a batch grown by learner batching changes: "count" (more minibatches of the same size:
    # the same gradient steps per sample) or "size" (as many minibatches, larger: the same gradient
    # steps per update, for a GPU, whose step takes as long for many more samples).
    minibatch_growth: str = "count"
    rho_bar: float = 1.0  # V-trace clip on the importance weight of the TD error
    c_bar: float = 1.0  # V-trace clip on the trace-cutting coefficient
    max_policy_lag: int = 20  # updates; older rollouts are dropped and counted
    publish_every: int = 1  # rank 0 sends weights to the coordinator every N updates
    # Each minibatch's advantages standardized per member (SB3's default).
    normalize_advantage: bool = True
    log_std_init: float = 0.0  # a Gaussian policy's starting log standard deviation (SB3's log_std_init)
    # Rewards divided by the running std of their slot's discounted return, clipped to ±reward_clip
    # (SB3's VecNormalize norm_reward; learners/normalization.py).
    normalize_reward: bool = False
    reward_clip: float = 10.0
    # The policy's and the value's hidden layers: "tanh" (SB3's and CleanRL's PPO default) or
    # "relu" (gymnax-blines' and PureJaxRL's MinAtar agents).
    activation: str = "tanh"

    def __post_init__(self) -> None:
        refuse_non_finite(self, "ppo")
        problems = [f"ppo.{name} must be at least 1" for name in
                    ("epochs", "minibatches", "rollouts_per_batch", "publish_every")
                    if getattr(self, name) < 1]
        checks = {
            "learning_rate > 0": self.learning_rate > 0,
            "0 < gamma <= 1": 0 < self.gamma <= 1,
            "0 <= gae_lambda <= 1": 0 <= self.gae_lambda <= 1,
            "clip_coef > 0": self.clip_coef > 0,
            "rho_bar > 0 and c_bar > 0": self.rho_bar > 0 and self.c_bar > 0,
            "max_grad_norm > 0": self.max_grad_norm > 0,
            "max_policy_lag >= 0": self.max_policy_lag >= 0,
            "anneal_steps >= 0": self.anneal_steps >= 0,
            "reward_clip > 0": self.reward_clip > 0,
            "0 <= anneal_floor <= 1": 0 <= self.anneal_floor <= 1,
            "max_rollouts_per_batch >= 0": self.max_rollouts_per_batch >= 0,
            'activation is "tanh" or "relu"': self.activation in ("tanh", "relu"),
            'minibatch_growth is "count" or "size"': self.minibatch_growth in ("count", "size"),
        }
        problems += [f"ppo: {rule}" for rule, ok in checks.items() if not ok]
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class ReplayConfig:
    """What every off-policy algorithm shares: each learner rank's replay shard and how often the
    learners train from it (learners/trainers.py, OffPolicyTrainer)."""

    batch_size: int = 256  # per rank and member
    buffer_size: int = 100_000  # transitions per rank and member
    learning_starts: int = 1_000  # env steps of a member before its first update
    replay_ratio: float = 1.0  # gradient updates per env step (of each member, over all ranks)
    publish_every: int = 1  # rank 0 sends weights to the coordinator every N learner iterations
    # n-step returns: bootstrap from the observation n env steps on, over the n rewards between
    # (Ape-X and Rainbow use 3); never across an episode's end or a rollout's. Discounted with the
    # member's γ when its transitions are stored (a PBT change of γ applies to new ones).
    n_step: int = 1
    # The learning rate falls linearly to lr_final_fraction × learning_rate over a member's first
    # lr_decay_steps gradient steps, then stays there; 0: constant (as SB3's defaults).
    lr_decay_steps: int = 0
    lr_final_fraction: float = 0.1
    # With a population: every member draws its batches from all members' transitions on its rank,
    # not only its own (the shared memory of AgileRL's populations and Fast Population-Based RL), so
    # a member learns from P times the data its own actors bring. replay_ratio still counts per env
    # step of the member: a member then takes 1/P of a lone agent's gradient steps per env step of
    # the whole run, and P × replay_ratio gives it as many.
    share_replay: bool = False

    def __post_init__(self) -> None:
        refuse_non_finite(self, type(self).__name__.removesuffix("Config").lower())  # sac, td3, dqn
        problems = [f"{name} must be positive" for name in ("batch_size", "buffer_size", "replay_ratio",
                    "publish_every", "n_step") if getattr(self, name) <= 0]
        if self.learning_starts < 0 or self.lr_decay_steps < 0:
            problems.append("learning_starts and lr_decay_steps must not be negative")
        if not 0 < self.lr_final_fraction <= 1:
            problems.append("lr_final_fraction must be in (0, 1]")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class SACConfig(ReplayConfig):
    """Soft actor-critic (Haarnoja et al. 2018) with twin critics, target critics and automatic
    entropy tuning (learners/sac.py)."""

    # RL-Zoo's Pendulum-v1 settings for SB3 (lr 1e-3, the rest SB3's defaults).
    learning_rate: float = 1e-3  # actor, critics and temperature
    gamma: float = 0.99
    tau: float = 0.005  # Polyak step of the target critics
    hidden_sizes: tuple[int, ...] = (256, 256)
    target_entropy: float | None = None  # None: −(action dimensions)
    init_temperature: float = 1.0
    # β of the actors' exploration noise, whose power spectrum falls as 1/f^β along an episode
    # (common/noise.py): 0 white (each step's draw independent, as SAC's paper), 1 pink.
    noise_color: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.learning_rate > 0 and self.init_temperature > 0 and 0 < self.gamma <= 1 and 0 < self.tau <= 1
                and self.noise_color >= 0):
            raise ValueError("sac: need learning_rate > 0, init_temperature > 0, 0 < gamma ≤ 1, 0 < tau ≤ 1, "
                             "noise_color ≥ 0")
        if not self.hidden_sizes or min(self.hidden_sizes) < 1:
            raise ValueError("sac.hidden_sizes must be positive")


@dataclass(frozen=True)
class TD3Config(ReplayConfig):
    """Twin delayed DDPG (Fujimoto et al. 2018): a deterministic actor, twin critics, target actor
    and critics, target policy smoothing, delayed actor and target updates (learners/td3.py)."""

    # SB3's TD3 defaults (RL-Zoo's Pendulum-v1 entry changes only γ, buffer and warm-up), with
    # SAC's 256×256 nets rather than SB3's 400×300.
    learning_rate: float = 1e-3  # actor and critics
    gamma: float = 0.99
    tau: float = 0.005  # Polyak step of the target actor and critics
    hidden_sizes: tuple[int, ...] = (256, 256)
    policy_delay: int = 2  # the actor and the targets move once per this many critic steps
    target_noise: float = 0.2  # std of the target policy smoothing noise, in [-1, 1] action units
    noise_clip: float = 0.5  # ... clipped to ±this
    # Actors add Gaussian noise of this std × half the action range, then clip to the bounds; until
    # the member has `learning_starts` env steps they act uniformly at random (as SB3 and the paper).
    exploration_noise: float = 0.1
    noise_color: float = 0.0  # β of that noise's 1/f^β spectrum, as SACConfig's

    def __post_init__(self) -> None:
        super().__post_init__()
        checks = {
            "learning_rate > 0": self.learning_rate > 0,
            "0 < gamma <= 1": 0 < self.gamma <= 1,
            "0 < tau <= 1": 0 < self.tau <= 1,
            "policy_delay >= 1": self.policy_delay >= 1,
            "target_noise >= 0, noise_clip >= 0, exploration_noise >= 0, noise_color >= 0":
                min(self.target_noise, self.noise_clip, self.exploration_noise, self.noise_color) >= 0,
            "hidden_sizes positive": bool(self.hidden_sizes) and min(self.hidden_sizes) >= 1,
        }
        problems = [f"td3: {rule}" for rule, ok in checks.items() if not ok]
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class DQNConfig(ReplayConfig):
    """Deep Q-network (Mnih et al. 2015) with double-Q targets (van Hasselt et al. 2016), a target
    network (hard-copied or Polyak-averaged), Huber loss and ε-greedy actors (learners/dqn.py)."""

    # RL-Zoo's CartPole-v1 settings for SB3: lr 2.3e-3, batch 64, buffer 100 k, learning_starts 1 k,
    # γ 0.99, 256×256, exploration over 16 % of the run down to ε 0.04. RL-Zoo trains 128 gradient
    # steps after every 256 env steps (train_freq 256, gradient_steps 128): replay_ratio 0.5.
    batch_size: int = 64
    replay_ratio: float = 0.5
    learning_rate: float = 2.3e-3
    gamma: float = 0.99
    hidden_sizes: tuple[int, ...] = (256, 256)
    # Gradient steps between two hard copies of the Q network into the target. RL-Zoo's 10 counts
    # env steps, and SB3 checks it only while collecting: the target is refreshed during each
    # 256-step collection phase and then held fixed through the 128 gradient steps that follow, so
    # in gradient steps RL-Zoo's target lags by up to 128 steps. Here learners train while actors
    # collect, so the interval counts gradient steps: 128 keeps RL-Zoo's target lag (and with the
    # run's default 8 × 32-step rollouts and replay_ratio 0.5, one refresh per rollout as there).
    target_update_interval: int = 128
    # Polyak step of each target update: target ← τ·Q + (1 − τ)·target. 1 (SB3's default) is the hard
    # copy; a small τ with target_update_interval 1 is the soft update SAC and TD3 use.
    tau: float = 1.0
    max_grad_norm: float | None = 10.0  # per member, on the rank-averaged gradient; None: no clipping
    # ε falls linearly from initial to final over exploration_fraction × RunConfig.total_steps /
    # population env steps of the member (computed by the actors from the weights' trained_steps).
    exploration_fraction: float = 0.16
    exploration_initial_eps: float = 1.0
    exploration_final_eps: float = 0.04

    def __post_init__(self) -> None:
        super().__post_init__()
        checks = {
            "learning_rate > 0": self.learning_rate > 0,
            "0 < gamma <= 1": 0 < self.gamma <= 1,
            "target_update_interval >= 1": self.target_update_interval >= 1,
            "0 < tau <= 1": 0 < self.tau <= 1,
            "max_grad_norm > 0 (or None)": self.max_grad_norm is None or self.max_grad_norm > 0,
            "0 <= exploration_fraction <= 1": 0 <= self.exploration_fraction <= 1,
            "0 <= exploration_final_eps, exploration_initial_eps <= 1":
                0 <= self.exploration_final_eps <= 1 and 0 <= self.exploration_initial_eps <= 1,
            "hidden_sizes positive": bool(self.hidden_sizes) and min(self.hidden_sizes) >= 1,
        }
        problems = [f"dqn: {rule}" for rule, ok in checks.items() if not ok]
        if problems:
            raise ValueError("; ".join(problems))


AlgoConfig = PPOConfig | SACConfig | TD3Config | DQNConfig


@dataclass(frozen=True)
class Algorithm:
    """What every process needs to know of an algorithm, declared once. Its NumPy actor policy is
    `common/models.py` POLICIES[name], its trainer `learners/trainers.py` TRAINERS[name]; a test
    holds the three registries, and RunConfig's sections, to the same names."""

    name: str  # --algo, and its section of RunConfig (and of a TOML run config)
    config: type[AlgoConfig]
    tunable: tuple[str, ...]  # fields of `config` that population-based training may set per member
    action_kinds: tuple[str, ...]  # the action spaces it can act in
    # Learns from its current policy's data only: rollouts too many updates old are dropped (the
    # lag gate); off-policy data stay useful however old.
    on_policy: bool
    takes_images: bool  # its networks can put a convolutional encoder in front (common/images.py)


ALGORITHMS = {algorithm.name: algorithm for algorithm in (
    Algorithm("ppo", PPOConfig, ("learning_rate", "ent_coef", "clip_coef", "vf_coef", "gamma", "gae_lambda",
                                 "max_grad_norm"), ("discrete", "continuous"), on_policy=True,
              takes_images=True),
    Algorithm("sac", SACConfig, ("learning_rate", "gamma", "tau"), ("continuous",), on_policy=False,
              takes_images=False),
    Algorithm("td3", TD3Config, ("learning_rate", "gamma", "tau"), ("continuous",), on_policy=False,
              takes_images=False),
    Algorithm("dqn", DQNConfig, ("learning_rate", "gamma"), ("discrete",), on_policy=False, takes_images=True),
)}
ALL_TUNABLE = frozenset(name for algorithm in ALGORITHMS.values() for name in algorithm.tunable)


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
    selection: str = "truncation"  # truncation | tournament
    fraction: float = 0.25  # truncation: the bottom fraction copies a member of the top fraction
    tournament_size: int = 3  # tournament: members drawn; the fittest is the one to copy
    elitism: bool = True  # tournament: the fittest member is never replaced
    perturb_factors: tuple[float, ...] = (0.8, 1.25)  # explore: multiply by one of these ...
    resample_probability: float = 0.25  # ... or, with this probability, draw afresh from the range
    param_noise: float = 0.0  # std of Gaussian noise added to copied weights (0: none)
    fitness_episodes: int = 20  # fitness: mean return of the member's last this many episodes
    ranges: dict[str, HyperRange] = field(default_factory=_default_ranges)

    def __post_init__(self) -> None:
        refuse_non_finite(self, "pbt")
        problems = []
        if self.selection not in ("truncation", "tournament"):
            problems.append(f"pbt.selection {self.selection!r} is not truncation or tournament")
        if self.interval < 1 or self.tournament_size < 1 or self.fitness_episodes < 1:
            problems.append("pbt.interval, tournament_size and fitness_episodes must be at least 1")
        if not 0 < self.fraction <= 0.5:
            problems.append("pbt.fraction must be in (0, 0.5]")
        if not self.perturb_factors or min(self.perturb_factors) <= 0:
            problems.append("pbt.perturb_factors must be positive")
        if not 0 <= self.resample_probability <= 1 or self.param_noise < 0:
            problems.append("pbt.resample_probability must be in [0, 1] and param_noise ≥ 0")
        for name, r in self.ranges.items():
            if name not in ALL_TUNABLE:
                problems.append(f"pbt.ranges.{name}: not tunable; tunable are {', '.join(sorted(ALL_TUNABLE))}")
                continue
            lo, hi, lo_inclusive = _TUNABLE_BOUNDS.get(name, (0.0, 1e9, False))
            if not (r.low <= r.high and (lo <= r.low if lo_inclusive else lo < r.low) and r.high <= hi):
                bound = "≤" if lo_inclusive else "<"
                problems.append(f"pbt.ranges.{name}: need {lo:g} {bound} low ≤ high ≤ {hi:g}")
            elif r.log and r.low <= 0:
                problems.append(f"pbt.ranges.{name}: a log range needs low > 0")
        if problems:
            raise ValueError("; ".join(problems))


# `RunConfig.compile_update`: "off" runs the learners' update eagerly; "default" and "max-autotune"
# with kernels torch.compile generates in that mode; "reduce-overhead" ("default"'s kernels) and
# "max-autotune" replay each part of a gradient step as a CUDA graph on a GPU, and "cuda-graphs" does
# with eager kernels, compiling nothing (learners/capture.py). On a CPU graphs are not replayed.
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune", "cuda-graphs")


@dataclass(frozen=True)
class RunConfig:
    """What one run learns. Stored in Redis by the coordinator and sent to every process."""

    env_id: str = "CartPole-v1"
    algo: str = "ppo"
    num_learners: int = 1  # the coordinator hands out work once this many learners registered
    num_envs: int = 8  # vector-env slots per actor
    rollout_length: int = 32  # steps per rollout message
    total_steps: int = 1_000_000  # env-step budget summed over all actors
    target_return: float | None = None  # stop once the mean of the last `return_window` episodes reaches it
    return_window: int = 100  # episodes (of one member) the mean return is taken over; at most 100
    seed: int = 0
    hidden_sizes: tuple[int, ...] = (64, 64)
    # Actor and learner heartbeat period. The run ends on the report that reaches the target, so an
    # actor's period is also how late the end can be seen (0.5 s cost CartPole runs ~0.25 s of ~5).
    report_interval_s: float = 0.25
    # Credit-based flow control: each learner rank lets at most this many rollouts be collected
    # for it at once. It bounds policy lag whatever the number of actors (docs/architecture.md).
    # 1: no rollout is collected for a learner while it trains on the last one, so its data is
    # never older than the update it feeds; more in flight buys throughput at the price of policy
    # lag (with 10 epochs an update moves the policy a lot: lag costs more samples than it saves).
    rollouts_in_flight: int = 1
    # With a population: how long a member's batch may wait for the other members' before the
    # learners update without them (members with slow actors, or none, must not stall the rest).
    batch_wait_s: float = 0.05
    # How long a learner rank with a batch waits for the other ranks before the world updates
    # without them: a rank whose actors died with its credits must not hold the others hostage.
    rank_wait_s: float = 0.25
    # Running observation normalization (learners/normalization.py): each member's features are
    # standardized by the mean and variance of all its data so far, then clipped to ±obs_clip.
    normalize_obs: bool = False
    obs_clip: float = 10.0
    # The convolutional encoder in front of the heads (common/images.py): "auto" gives image
    # observations a CNN sized to them (when the algorithm takes images), "mlp" flattens them.
    encoder: str = "auto"
    # Learners train on the sign of each reward (Atari's reward clipping, Mnih et al. 2015) while
    # actors report episode returns as the env gives them. None: for ALE/* envs only.
    sign_rewards: bool | None = None
    # Learner checkpoints (learners/checkpoint.py): every rank's whole state, this often and when
    # the run stops; each rank keeps the newest `checkpoints_kept`. 0: only when the run stops.
    checkpoint_interval_s: float = 60.0
    checkpoints_kept: int = 3
    ppo: PPOConfig = field(default_factory=PPOConfig)
    sac: SACConfig = field(default_factory=SACConfig)
    td3: TD3Config = field(default_factory=TD3Config)
    dqn: DQNConfig = field(default_factory=DQNConfig)
    population: int = 1  # members trained together; more than 1 turns on population-based training
    pbt: PBTConfig = field(default_factory=PBTConfig)
    # The learners' update under torch.compile (learners/capture.py): "off" (eager), or a mode of
    # torch.compile's, or "cuda-graphs" (COMPILE_MODES says which replay CUDA graphs on a GPU).
    compile_update: str = "off"

    @property
    def algo_config(self) -> AlgoConfig:
        """The run's algorithm's section (its entry's config class)."""
        section: AlgoConfig = getattr(self, self.algo)
        assert isinstance(section, ALGORITHMS[self.algo].config)
        return section

    @property
    def signs_rewards(self) -> bool:
        """Whether learners train on the rewards' signs (`sign_rewards`, or its default)."""
        return self.env_id.startswith("ALE/") if self.sign_rewards is None else self.sign_rewards

    def encoder_for(self, spec: EnvSpec) -> str:
        """The encoder this run's networks put in front of their heads for `spec`'s observations
        (`images.resolve_encoder`: ValueError if the one named does not fit)."""
        return resolve_encoder(self.encoder, spec, ALGORITHMS[self.algo].takes_images)

    def base_hyperparams(self) -> dict[str, float]:
        """The algorithm's tunable hyperparameters as the config sets them (each member's start
        when they are not ranged)."""
        return {name: float(getattr(self.algo_config, name)) for name in ALGORITHMS[self.algo].tunable}

    def __post_init__(self) -> None:
        refuse_non_finite(self)
        problems = []
        if not 1 <= self.return_window <= 100:
            problems.append("return_window must be in [1, 100]")
        if not 1 <= self.population <= 256:
            problems.append("population must be in [1, 256]")
        if self.algo not in ALGORITHMS:
            raise ValueError(f"algo {self.algo!r} is not one of {', '.join(ALGORITHMS)}")
        tunable = ALGORITHMS[self.algo].tunable
        if self.population > 1 and any(name not in tunable for name in self.pbt.ranges):
            problems.append(f"pbt.ranges: {self.algo} tunes only {', '.join(tunable)}")
        section = self.algo_config
        shares_n_step = isinstance(section, ReplayConfig) and section.share_replay and section.n_step > 1
        if shares_n_step and "gamma" in self.pbt.ranges:
            # n-step returns are summed with the storing member's γ: another member's γ would differ.
            problems.append(f"{self.algo}.share_replay with n_step > 1 needs one γ: take gamma out of pbt.ranges")
        for name in ("num_learners", "num_envs", "rollout_length", "total_steps", "rollouts_in_flight"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1")
        if self.seed < 0:
            problems.append("seed must not be negative")
        if self.report_interval_s <= 0:
            problems.append("report_interval_s must be positive")
        if self.checkpoint_interval_s < 0 or self.checkpoints_kept < 1:
            problems.append("need checkpoint_interval_s >= 0 and checkpoints_kept >= 1")
        if not 0 <= self.batch_wait_s <= self.rank_wait_s:
            problems.append("need 0 <= batch_wait_s <= rank_wait_s")
        if self.rollouts_in_flight < self.ppo.rollouts_per_batch:
            problems.append("rollouts_in_flight must be at least ppo.rollouts_per_batch")
        if not self.hidden_sizes or min(self.hidden_sizes) < 1:
            problems.append("hidden_sizes must be positive")
        if self.obs_clip <= 0:
            problems.append("obs_clip must be positive")
        if self.encoder not in ENCODER_CHOICES:
            problems.append(f"encoder must be one of {', '.join(ENCODER_CHOICES)}")
        if self.compile_update not in COMPILE_MODES:
            problems.append(f"compile_update must be one of {', '.join(COMPILE_MODES)}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class CoordinatorConfig:
    run: str
    redis_url: str
    run_config: RunConfig
    control_bind: str = "tcp://*:5555"  # ROUTER: Hello, reports, weights
    broadcast_bind: str = "tcp://*:5556"  # PUB: weights and directives
    # Listening sockets `rlmq up` bound for these and handed down (-1: bind here): their ports
    # cannot be taken between the supervisor's choice and the coordinator's start.
    control_fd: int = -1
    broadcast_fd: int = -1
    metrics_port: int = 0  # 0 picks a free port; -1 disables /metrics
    bind_host: str = "*"  # where /metrics listens ("*": every interface; `rlmq up`: 127.0.0.1)
    announce_file: str = ""  # write the ports bound here (`rlmq up`)
    actor_timeout_s: float = 10.0  # an actor silent this long counts as gone
    shutdown_grace_s: float = 5.0  # after `stop`, wait this long for learners' final weights
    redis_outage_s: float = 30.0  # ride out a Redis outage this long (retrying), then exit 1
    keys_dir: str = ""  # the run's CURVE keys (common/security.py); "": plain ZeroMQ
    failpoint: str = ""  # tests only: a named point at which to die (coordinator/population.py)


@dataclass(frozen=True)
class LearnerConfig:
    run: str
    coordinator: str  # control endpoint, e.g. tcp://coordinator:5555
    broadcast: str  # the coordinator's PUB endpoint
    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"  # torch.distributed rendezvous (rank 0's address)
    master_port: int = 29500
    master_fd: int = -1  # rank 0: the rendezvous socket `rlmq up` bound for it (-1: bind here)
    bind_host: str = "*"  # where every listener binds: experience, /metrics, rank 0's rendezvous
    advertise_host: str = "127.0.0.1"  # how actors reach this learner's experience socket
    experience_port: int = 0  # 0 picks a free port
    experience_fd: int = -1  # a socket listening at experience_port that `rlmq up` bound (-1: bind here)
    # A Unix socket path: experience over ipc:// there instead of TCP, for actors on this host
    # (`rlmq up --transport ipc`); experience_fd is then a socket listening at that path.
    experience_ipc: str = ""
    # A credit not used within a few times the slowest recent rollout turnaround, kept within these
    # bounds, is taken back: its actor died (learners/credits.py; the floor: benchmarks/RESULTS.md §8).
    credit_timeout_min_s: float = 0.5
    credit_timeout_s: float = 10.0
    metrics_port: int = 0
    announce_file: str = ""  # write the ports bound here (`rlmq up`)
    device: str = "auto"  # auto | cpu | cuda
    torch_threads: int = 1  # intra-op threads; more fight each other on shared cores
    # A collective (the per-iteration agreement, DDP's all-reduce) that waits longer for a peer
    # fails the rank. The rendezvous at start waits longer: ranks may start minutes apart.
    collective_timeout_s: float = 30.0
    checkpoint_dir: str = ""  # the root of the learner checkpoints (each rank: its rank{r}/); "": none
    keys_dir: str = ""  # the run's CURVE keys (common/security.py); "": plain ZeroMQ
    failpoint: str = ""  # tests only: a named point at which to die (learners/learner.py)

    def __post_init__(self) -> None:
        if not 0 < self.credit_timeout_min_s <= self.credit_timeout_s:
            raise ValueError(f"credit timeouts: need 0 < minimum ({self.credit_timeout_min_s:g} s) <= "
                             f"maximum ({self.credit_timeout_s:g} s)")


@dataclass(frozen=True)
class ActorConfig:
    name: str
    coordinator: str
    broadcast: str
    metrics_port: int = 0
    bind_host: str = "*"  # where /metrics listens ("*": every interface; `rlmq up`: 127.0.0.1)
    announce_file: str = ""  # write the ports bound here (`rlmq up`)
    keys_dir: str = ""  # the run's CURVE keys (common/security.py); "": plain ZeroMQ
    key_name: str = ""  # its key there; "": `name`'s
    max_steps: int | None = None  # stop after this many env steps (tests, benchmarks)
