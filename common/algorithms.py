"""Each algorithm's config section and its one declaration (`ALGORITHMS`): name, section,
tunable hyperparameters, the action kinds it acts in, on- or off-policy, whether it takes images.
Also the checks every config shares: finite numbers, and each tunable hyperparameter's bounds.

A run config (config.py) holds one section per algorithm; every process finds what it needs of the
run's algorithm here, by name. Only entry points build these; nothing mutates them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from rlmq.common.architecture import ACTIVATIONS, is_shape_hyperparam, layers_problems, shape_problems

# Where each tunable hyperparameter must stay whatever a range says: (low, high, low inclusive).
_TUNABLE_BOUNDS = {
    "gamma": (0.0, 1.0, False),
    "gae_lambda": (0.0, 1.0, True),
    "ent_coef": (0.0, 1e9, True),
    "vf_coef": (0.0, 1e9, True),
    "tau": (0.0, 1.0, False),
}


def tunable_bounds(name: str) -> tuple[float, float, bool]:
    """(low, high, low inclusive) of a tunable hyperparameter: positive and finite unless named above."""
    return _TUNABLE_BOUNDS.get(name, (0.0, 1e9, False))


def hyperparam_problems(hyperparams: dict[str, float]) -> list[str]:
    """What is out of bounds in a member's hyperparameters (e.g. γ > 1), by name; its network's
    shape (common/architecture.py) included."""
    problems = []
    for name, value in hyperparams.items():
        if is_shape_hyperparam(name):
            problems += shape_problems(name, value)
            continue
        lo, hi, lo_inclusive = tunable_bounds(name)
        if not ((lo <= value if lo_inclusive else lo < value) and value <= hi):
            problems.append(f"{name} = {value:g} outside {'[' if lo_inclusive else '('}{lo:g}, {hi:g}]")
    return problems or layers_problems(hyperparams)


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


MINIBATCH_GROWTHS = ("count", "size", "sqrt")  # PPOConfig.minibatch_growth
SYNC_MODES = ("auto", "gradients", "batch")  # OnPolicyConfig.sync


class Batching(NamedTuple):
    """How the learner gathers an algorithm's rollouts into an update (learners/members.py)."""

    rollouts_per_batch: int  # rollouts each learner rank gathers before one update
    max_rollouts_per_batch: int  # learner batching's bound; 0: exactly rollouts_per_batch
    max_policy_lag: int | None  # the lag gate: rollouts this many updates old are dropped; None: no gate


@dataclass(frozen=True)
class OnPolicyConfig:
    """What every on-policy algorithm's section holds: how the learner batches its rollouts and how
    old a rollout it still learns from (`Algorithm.batching`), and what the on-policy trainer's
    shell builds and syncs (learners/onpolicy.py: the networks, reward scaling, replicas)."""

    rollouts_per_batch: int = 1  # rollouts each learner rank gathers before one update
    # IMPALA's learner batching: an update takes every rollout a member has queued, up to this
    # many (so more actors feed larger batches at the same policy lag), and its minibatches keep
    # their size: their number grows with the batch. The world takes the largest count any rank
    # has. The credits follow the fleet: one per actor heard from, at least rollouts_in_flight and
    # at most this many (learners/credits.py). 0: exactly rollouts_per_batch, rollouts_in_flight credits.
    max_rollouts_per_batch: int = 0
    max_policy_lag: int = 20  # updates; older rollouts are dropped and counted
    log_std_init: float = 0.0  # a Gaussian policy's starting log standard deviation (SB3's log_std_init)
    # Rewards divided by the running std of their slot's discounted return, clipped to ±reward_clip
    # (SB3's VecNormalize norm_reward; learners/normalization.py).
    normalize_reward: bool = False
    reward_clip: float = 10.0
    # The policy's and the value's hidden layers: "tanh" (SB3's and CleanRL's PPO default), "relu"
    # (gymnax-blines' and PureJaxRL's MinAtar agents) or "elu".
    activation: str = "tanh"
    # How learner ranks stay in step: "gradients" (DDP: each minibatch's gradient all-reduced),
    # "batch" (the ranks' batches all-gathered once per update, then every rank runs the same
    # update: one collective instead of epochs × minibatches, each rank computing all of it) or
    # "auto" (whichever the world times as cheaper when it forms: learners/replicas.py).
    sync: str = "auto"

    def shell_problems(self, section: str) -> list[str]:
        """What is wrong with the fields every on-policy trainer reads (learners/onpolicy.py)."""
        checks = {
            "rollouts_per_batch >= 1": self.rollouts_per_batch >= 1,
            "max_rollouts_per_batch >= 0": self.max_rollouts_per_batch >= 0,
            "max_policy_lag >= 0": self.max_policy_lag >= 0,
            "reward_clip > 0": self.reward_clip > 0,
            f"activation is one of {', '.join(ACTIVATIONS)}": self.activation in ACTIVATIONS,
            'sync is "auto", "gradients" or "batch"': self.sync in SYNC_MODES,
        }
        return [f"{section}: {rule}" for rule, ok in checks.items() if not ok]


@dataclass(frozen=True)
class PPOConfig(OnPolicyConfig):
    """Asynchronous PPO with V-trace targets (see learners/ppo.py)."""

    # Defaults tuned on CartPole-v1 (the default env) for wall time to a return of 475 on a
    # 2-core machine; see benchmarks/LOG.md §2. Many epochs on small fresh batches.
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
    # What a batch grown by learner batching changes: "count" (more minibatches of the same size:
    # the same gradient steps per sample), "size" (as many minibatches, larger: the same gradient
    # steps per update, for a GPU, whose step takes as long for many more samples) or "sqrt"
    # (between the two). learners/minibatching.py's `for_batch` says how each cuts a batch.
    minibatch_growth: str = "count"
    rho_bar: float = 1.0  # V-trace clip on the importance weight of the TD error
    c_bar: float = 1.0  # V-trace clip on the trace-cutting coefficient
    publish_every: int = 1  # rank 0 sends weights to the coordinator every N updates
    # Each minibatch's advantages standardized per member (SB3's default).
    normalize_advantage: bool = True
    # A recurrent core's minibatches are sequences of a slot's steps, backpropagated through whole:
    # the rollout's (0), or chunks of this many steps each, which start from the state the core
    # reached there with the update's starting weights (Sample Factory's `recurrence`): shorter
    # sequences, more of them, less time in the step-by-step loop.
    bptt_steps: int = 0

    def __post_init__(self) -> None:
        refuse_non_finite(self, "ppo")
        problems = [
            f"ppo.{name} must be at least 1"
            for name in ("epochs", "minibatches", "publish_every")
            if getattr(self, name) < 1
        ] + self.shell_problems("ppo")
        checks = {
            "learning_rate > 0": self.learning_rate > 0,
            "0 < gamma <= 1": 0 < self.gamma <= 1,
            "0 <= gae_lambda <= 1": 0 <= self.gae_lambda <= 1,
            "clip_coef > 0": self.clip_coef > 0,
            "rho_bar > 0 and c_bar > 0": self.rho_bar > 0 and self.c_bar > 0,
            "max_grad_norm > 0": self.max_grad_norm > 0,
            "anneal_steps >= 0": self.anneal_steps >= 0,
            "bptt_steps >= 0": self.bptt_steps >= 0,
            "0 <= anneal_floor <= 1": 0 <= self.anneal_floor <= 1,
            'minibatch_growth is "count", "size" or "sqrt"': self.minibatch_growth in MINIBATCH_GROWTHS,
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
    # Every network's hidden layers (SB3's off-policy defaults: ReLU); "tanh" or "elu" otherwise.
    activation: str = "relu"
    # At most this many gradient steps an iteration (0: every step due at once). The rest are owed
    # and paid in the next iterations before any new data is taken, so the replay ratio holds, and
    # the world agrees (a stop, a checkpoint, a decision) between chunks: a population's update on
    # a shared CPU core took tens of seconds at once (benchmarks/LOG.md §26).
    max_steps_per_update: int = 0

    def __post_init__(self) -> None:
        refuse_non_finite(self, type(self).__name__.removesuffix("Config").lower())  # sac, td3, dqn
        problems = [
            f"{name} must be positive"
            for name in ("batch_size", "buffer_size", "replay_ratio", "publish_every", "n_step")
            if getattr(self, name) <= 0
        ]
        if self.activation not in ACTIVATIONS:
            problems.append(f"activation {self.activation!r} is none of {', '.join(ACTIVATIONS)}")
        if self.learning_starts < 0 or self.lr_decay_steps < 0 or self.max_steps_per_update < 0:
            problems.append("learning_starts, lr_decay_steps and max_steps_per_update must not be negative")
        if not 0 < self.lr_final_fraction <= 1:
            problems.append("lr_final_fraction must be in (0, 1]")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class ActorCriticConfig(ReplayConfig):
    """What SAC and TD3 share beyond the replay: how a population's members relate."""

    # One pair of twin critics (and its target) for the whole population, trained on every
    # member's batch towards each member's own next action, where each member otherwise has its
    # own (CEM-RL's and DvD's shared critic; learners/td3.py).
    shared_critic: bool = False
    # DvD (learners/diversity.py): each actor step also descends λ·(−log det K) of the members'
    # kernel over their actions on shared states (length scale l, in action units); 0: no term.
    diversity_weight: float = 0.0
    diversity_length_scale: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.diversity_weight < 0 or self.diversity_length_scale <= 0:
            section = type(self).__name__.removesuffix("Config").lower()
            raise ValueError(f"{section}: need diversity_weight >= 0 and diversity_length_scale > 0")


@dataclass(frozen=True)
class SACConfig(ActorCriticConfig):
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
        if not (
            self.learning_rate > 0
            and self.init_temperature > 0
            and 0 < self.gamma <= 1
            and 0 < self.tau <= 1
            and self.noise_color >= 0
        ):
            raise ValueError(
                "sac: need learning_rate > 0, init_temperature > 0, 0 < gamma ≤ 1, 0 < tau ≤ 1, noise_color ≥ 0"
            )
        if not self.hidden_sizes or min(self.hidden_sizes) < 1:
            raise ValueError("sac.hidden_sizes must be positive")


@dataclass(frozen=True)
class TD3Config(ActorCriticConfig):
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
            "target_noise >= 0, noise_clip >= 0, exploration_noise >= 0, noise_color >= 0": min(
                self.target_noise, self.noise_clip, self.exploration_noise, self.noise_color
            )
            >= 0,
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
    # With a recurrent core (RunConfig.core; R2D2, Kapturowski et al. 2019): the replay keeps whole
    # rollout sequences of a slot with the state they started from, `batch_size` of them a batch,
    # and the first `burn_in` steps of each only warm the online network's state (no loss, no
    # gradient) before the loss over the rest.
    burn_in: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        checks = {
            "learning_rate > 0": self.learning_rate > 0,
            "0 < gamma <= 1": 0 < self.gamma <= 1,
            "target_update_interval >= 1": self.target_update_interval >= 1,
            "0 < tau <= 1": 0 < self.tau <= 1,
            "max_grad_norm > 0 (or None)": self.max_grad_norm is None or self.max_grad_norm > 0,
            "0 <= exploration_fraction <= 1": 0 <= self.exploration_fraction <= 1,
            "0 <= exploration_final_eps, exploration_initial_eps <= 1": 0 <= self.exploration_final_eps <= 1
            and 0 <= self.exploration_initial_eps <= 1,
            "hidden_sizes positive": bool(self.hidden_sizes) and min(self.hidden_sizes) >= 1,
            "burn_in >= 0": self.burn_in >= 0,
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
    takes_images: bool  # its networks can put a convolutional encoder in front (common/images.py)
    # Its networks can put a recurrent core between the encoder and the heads (RunConfig.core).
    takes_core: bool = False

    @property
    def on_policy(self) -> bool:
        """Learns from its current policy's data only (its section is an OnPolicyConfig): rollouts
        too many updates old are dropped (the lag gate); off-policy data stay useful however old."""
        return issubclass(self.config, OnPolicyConfig)

    def batching(self, section: AlgoConfig) -> Batching:
        """How the learner batches this algorithm's rollouts, from its config `section`: an
        on-policy section says (OnPolicyConfig); off-policy data go to the replay one rollout at a
        time, however old."""
        if isinstance(section, OnPolicyConfig):
            return Batching(section.rollouts_per_batch, section.max_rollouts_per_batch, section.max_policy_lag)
        return Batching(1, 0, None)


ALGORITHMS = {
    algorithm.name: algorithm
    for algorithm in (
        Algorithm(
            "ppo",
            PPOConfig,
            ("learning_rate", "ent_coef", "clip_coef", "vf_coef", "gamma", "gae_lambda", "max_grad_norm"),
            ("discrete", "continuous"),
            takes_images=True,
            takes_core=True,
        ),
        Algorithm("sac", SACConfig, ("learning_rate", "gamma", "tau"), ("continuous",), takes_images=False),
        Algorithm("td3", TD3Config, ("learning_rate", "gamma", "tau"), ("continuous",), takes_images=False),
        Algorithm("dqn", DQNConfig, ("learning_rate", "gamma"), ("discrete",), takes_images=True, takes_core=True),
    )
}
ALL_TUNABLE = frozenset(name for algorithm in ALGORITHMS.values() for name in algorithm.tunable)


def is_member_hyperparam(name: str) -> bool:
    """Whether a member's hyperparameters may hold `name`: a tunable, or a part of its network's
    shape that PBT mutates (common/architecture.py)."""
    return name in ALL_TUNABLE or is_shape_hyperparam(name)
