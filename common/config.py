"""Frozen configuration: the run (what to learn, travels to every process) and one per service.
Each algorithm's section of the run, and its declaration, are in algorithms.py.

Only entry points (the CLI) build these; nothing mutates them. The run config reaches actors and
learners inside `Assign`, so its fields are restricted to what `rlmq.common.wire` can carry.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from rlmq.common.algorithms import (
    ALGORITHMS,
    AlgoConfig,
    Batching,
    DQNConfig,
    PPOConfig,
    ReplayConfig,
    SACConfig,
    TD3Config,
    refuse_non_finite,
)
from rlmq.common.architecture import activation_code, width_name
from rlmq.common.images import ENCODER_CHOICES, resolve_encoder
from rlmq.common.population import CEMConfig, DvDConfig, method_problems
from rlmq.common.population import HyperRange as HyperRange
from rlmq.common.population import PBTConfig as PBTConfig
from rlmq.common.recurrent import CORES, STATE_PARTS
from rlmq.common.schema import EnvSpec

# What a service's `device` may say: auto, cpu, cuda or cuda:N.
DEVICE_PATTERN = r"auto|cpu|cuda(:\d+)?"


# `RunConfig.compile_update`: "off" runs the learners' update eagerly; "default" and "max-autotune"
# with kernels torch.compile generates in that mode; "reduce-overhead" ("default"'s kernels) and
@dataclass(frozen=True)
class EvaluationConfig:
    """The run's own evaluation (coordinator/evaluator.py): the verdict on `target_return` and PBT's
    fitness come from episodes a process of the coordinator's plays, never from what actors report."""

    episodes: int = 10  # per evaluation; 0: believe the actors' reported returns (a trusted network only)
    deterministic: bool = True  # the likeliest action (as `rlmq eval`), or the actors' own sampling
    timeout_s: float = 600.0  # an evaluation not back by then is given up (the evaluator restarted)
    # Also evaluate the best member's newest weights this often, seconds (0: only when the reported
    # returns reach the target or PBT asks). For fleets with many actors per learner, whose episodes
    # each span many policy versions: their returns say late what the newest weights do.
    every_s: float = 0.0

    def __post_init__(self) -> None:
        refuse_non_finite(self, "evaluation")
        if not 0 <= self.episodes <= 1000 or self.timeout_s <= 0 or self.every_s < 0:
            raise ValueError(
                "evaluation.episodes must be in [0, 1000], evaluation.timeout_s positive and evaluation.every_s ≥ 0"
            )


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
    # Stop once the run's own evaluation of a member reaches it (`evaluation`); the mean of a member's
    # last `return_window` reported episodes reaching it is what asks for that evaluation.
    target_return: float | None = None
    return_window: int = 100  # episodes (of one member) the mean return is taken over; at most 100
    seed: int = 0
    hidden_sizes: tuple[int, ...] = (64, 64)
    # Actor and learner heartbeat period. The run ends on the report that reaches the target, so an
    # actor's period is also how late the end can be seen, a share of a CartPole run's few seconds
    # (benchmarks/LOG.md §2).
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
    # A recurrent core between the encoder and the heads (Sample Factory's encoder → core → decoder):
    # "identity" (none: the heads take the encoder's output), "lstm" or "gru" of `core_size` units,
    # stepped by the actors with a state per env slot and recomputed by the learners over each
    # rollout from the state it started with (docs/architecture.md, "Recurrent policies").
    core: str = "identity"
    core_size: int = 64
    # Learners train on the sign of each reward (Atari's reward clipping, Mnih et al. 2015) while
    # actors report episode returns as the env gives them. None: for ALE/* envs only.
    sign_rewards: bool | None = None
    # Frames an ALE id's observations stack (its preprocessing's 4 when None); 1 for a recurrent
    # policy that remembers instead (CleanRL's ppo_atari_lstm). Other envs stack none.
    frame_stack: int | None = None
    # Learner checkpoints (learners/checkpoint.py): every rank's whole state, this often and when
    # the run stops; each rank keeps the newest `checkpoints_kept`. 0: only when the run stops.
    checkpoint_interval_s: float = 60.0
    checkpoints_kept: int = 3
    ppo: PPOConfig = field(default_factory=PPOConfig)
    sac: SACConfig = field(default_factory=SACConfig)
    td3: TD3Config = field(default_factory=TD3Config)
    dqn: DQNConfig = field(default_factory=DQNConfig)
    population: int = 1  # members trained together, by `method`
    method: str = "pbt"
    pbt: PBTConfig = field(default_factory=PBTConfig)
    cem: CEMConfig = field(default_factory=CEMConfig)
    dvd: DvDConfig = field(default_factory=DvDConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
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
    def batching(self) -> Batching:
        """How the learners batch this run's rollouts (its algorithm's entry says, from its section)."""
        return ALGORITHMS[self.algo].batching(self.algo_config)

    @property
    def core_state_size(self) -> int:
        """Floats in one env slot's core state (common/recurrent.py): 0 without a core."""
        return STATE_PARTS[self.core] * self.core_size if self.core in STATE_PARTS else 0

    @property
    def signs_rewards(self) -> bool:
        """Whether learners train on the rewards' signs (`sign_rewards`, or its default)."""
        return self.env_id.startswith("ALE/") if self.sign_rewards is None else self.sign_rewards

    def encoder_for(self, spec: EnvSpec) -> str:
        """The encoder this run's networks put in front of their heads for `spec`'s observations
        (`images.resolve_encoder`: ValueError if the one named does not fit)."""
        return resolve_encoder(self.encoder, spec, ALGORITHMS[self.algo].takes_images)

    @property
    def mutates_activations(self) -> bool:
        """Whether PBT switches members' hidden activations (`pbt.activations`)."""
        return self.population > 1 and bool(self.pbt.activations)

    @property
    def mutates_widths(self) -> bool:
        """Whether PBT changes members' hidden widths (`pbt.node_probability`)."""
        return self.population > 1 and self.pbt.node_probability > 0

    @property
    def mutates_depth(self) -> bool:
        """Whether PBT adds and removes members' hidden layers (`pbt.layer_probability`)."""
        return self.population > 1 and self.pbt.layer_probability > 0

    @property
    def mutates_layers(self) -> bool:
        """Whether members' hidden layers are their own (widths, depth: "width.i"), within layers
        allocated wider or deeper (`allocated`)."""
        return self.mutates_widths or self.mutates_depth

    @property
    def member_hidden_sizes(self) -> tuple[int, ...]:
        """The hidden layers of the algorithm's MLPs: PPO's `hidden_sizes`, else its section's."""
        section = self.algo_config
        return self.hidden_sizes if isinstance(section, PPOConfig) else section.hidden_sizes

    def allocated(self) -> RunConfig:
        """The config the learners build their networks from: every hidden layer `pbt.max_width`
        wide where PBT changes widths (members use a prefix of each: `member_widths`), and
        `pbt.max_layers` of them, as wide as the widest hidden size, where it changes depth."""
        if not self.mutates_layers:
            return self
        sizes = self.member_hidden_sizes
        layers = self.pbt.max_layers if self.mutates_depth else len(sizes)
        wide = (self.pbt.max_width if self.mutates_widths else max(sizes),) * layers
        if isinstance(self.algo_config, PPOConfig):
            return dataclasses.replace(self, hidden_sizes=wide)
        changes: dict[str, Any] = {self.algo: dataclasses.replace(self.algo_config, hidden_sizes=wide)}
        return dataclasses.replace(self, **changes)

    def with_activation(self, activation: str) -> RunConfig:
        """This config with its algorithm's hidden activation set to `activation` (a member's, as
        PBT mutated it)."""
        changes: dict[str, Any] = {self.algo: dataclasses.replace(self.algo_config, activation=activation)}
        return dataclasses.replace(self, **changes)

    def base_hyperparams(self) -> dict[str, float]:
        """The algorithm's tunable hyperparameters as the config sets them (each member's start
        when they are not ranged), the activation's code where PBT mutates it, and each allocated
        hidden layer's width where it mutates widths or depth (0 for a layer beyond the config's)."""
        section = self.algo_config
        base = {name: float(getattr(section, name)) for name in ALGORITHMS[self.algo].tunable}
        if self.mutates_activations:
            base["activation"] = activation_code(section.activation)
        if self.mutates_layers:
            sizes = self.member_hidden_sizes
            layers = self.pbt.max_layers if self.mutates_depth else len(sizes)
            base.update({width_name(i): float(sizes[i] if i < len(sizes) else 0) for i in range(layers)})
        return base

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
        if self.rollouts_in_flight < self.batching.rollouts_per_batch:
            problems.append(f"rollouts_in_flight must be at least {self.algo}.rollouts_per_batch")
        if not self.hidden_sizes or min(self.hidden_sizes) < 1:
            problems.append("hidden_sizes must be positive")
        if self.obs_clip <= 0:
            problems.append("obs_clip must be positive")
        if self.frame_stack is not None and self.frame_stack < 1:
            problems.append("frame_stack must be at least 1")
        if self.encoder not in ENCODER_CHOICES:
            problems.append(f"encoder must be one of {', '.join(ENCODER_CHOICES)}")
        if self.compile_update not in COMPILE_MODES:
            problems.append(f"compile_update must be one of {', '.join(COMPILE_MODES)}")
        problems += self.core_problems()
        problems += method_problems(
            self.method, section, self.population, self.pbt, self.cem, self.dvd, self.normalize_obs
        )
        if (self.mutates_activations or self.mutates_layers) and self.compile_update != "off":
            problems.append(
                "pbt.activations, node_probability and layer_probability change a member's network "
                'between updates: set compile_update = "off"'
            )
        widest, narrowest = max(self.member_hidden_sizes), min(self.member_hidden_sizes)
        if self.mutates_widths and not self.pbt.min_width <= narrowest <= widest <= self.pbt.max_width:
            problems.append(
                f"pbt.min_width ≤ every hidden size ≤ pbt.max_width: the hidden sizes are "
                f"{list(self.member_hidden_sizes)}, the widths [{self.pbt.min_width}, {self.pbt.max_width}]"
            )
        if self.mutates_depth and not self.pbt.min_layers <= len(self.member_hidden_sizes) <= self.pbt.max_layers:
            problems.append(
                f"pbt.min_layers ≤ the hidden layers ≤ pbt.max_layers: {len(self.member_hidden_sizes)} "
                f"hidden layers, the bounds [{self.pbt.min_layers}, {self.pbt.max_layers}]"
            )
        if problems:
            raise ValueError("; ".join(problems))

    def core_problems(self) -> list[str]:
        """What is wrong with the recurrent core for this run's algorithm."""
        if self.core not in CORES:
            return [f"core must be one of {', '.join(CORES)}"]
        if self.core == "identity":
            return []
        problems = [] if self.core_size >= 1 else ["core_size must be at least 1"]
        if not ALGORITHMS[self.algo].takes_core:
            takers = ", ".join(name for name, a in ALGORITHMS.items() if a.takes_core)
            problems.append(f'core = "{self.core}": {self.algo} has no recurrent policy (it is for {takers})')
        if self.compile_update != "off":
            problems.append('a recurrent core trains eagerly: set compile_update = "off"')
        section = self.algo_config
        if isinstance(section, DQNConfig) and section.burn_in >= self.rollout_length:
            problems.append("dqn.burn_in must be shorter than rollout_length (the sequences the replay keeps)")
        if isinstance(section, DQNConfig) and section.share_replay:
            problems.append("a recurrent core's replay is each member's own: set dqn.share_replay = false")
        if isinstance(section, PPOConfig):
            chunks = self.rollout_length // (section.bptt_steps or self.rollout_length)
            if section.bptt_steps and self.rollout_length % section.bptt_steps:
                problems.append("ppo.bptt_steps must divide rollout_length")
            elif section.minibatches > self.num_envs * section.rollouts_per_batch * chunks:
                problems.append(
                    "a recurrent core's minibatches are whole sequences: ppo.minibatches must be at most "
                    "num_envs × ppo.rollouts_per_batch × rollout_length / ppo.bptt_steps"
                )
        return problems


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
    failpoint: str = ""  # tests only: a named point at which to die (common/failpoints.py)
    tensorboard_dir: str = ""  # where the run's TensorBoard curves go (coordinator/curves.py); "": none
    tensorboard_max_mb: float = 256.0  # past this the curves stop growing


EXPERIENCE_PORT = 5557  # rank r's default experience port is this + r (the coordinator's: 5555, 5556)


@dataclass(frozen=True)
class LearnerConfig:
    run: str
    coordinator: str  # control endpoint, e.g. tcp://coordinator:5555
    broadcast: str  # the coordinator's PUB endpoint
    rank: int = 0
    world_size: int = 1
    # torch.distributed's rendezvous, at rank 0. "auto": rank 0 its own advertised address, every
    # other rank rank 0's, as the coordinator has it from rank 0's registration.
    master_addr: str = "auto"
    master_port: int = 29500
    master_fd: int = -1  # rank 0: the rendezvous socket `rlmq up` bound for it (-1: bind here)
    bind_host: str = "*"  # where every listener binds: experience, /metrics, rank 0's rendezvous
    # How actors and peer ranks reach this learner. "auto": the address this host's routes use
    # towards the coordinator (common/addresses.py), which everything else reaches too.
    advertise_host: str = "auto"
    experience_port: int = EXPERIENCE_PORT  # 0 picks a free port; the CLI's default is this + rank
    experience_fd: int = -1  # a socket listening at experience_port that `rlmq up` bound (-1: bind here)
    # A Unix socket path: experience over ipc:// there instead of TCP, for actors on this host
    # (`rlmq up --transport ipc`); experience_fd is then a socket listening at that path.
    experience_ipc: str = ""
    # A credit not used within a few times the slowest recent rollout turnaround, kept within these
    # bounds, is taken back: its actor died (learners/credits.py; the floor: benchmarks/LOG.md §8).
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
            raise ValueError(
                f"credit timeouts: need 0 < minimum ({self.credit_timeout_min_s:g} s) <= "
                f"maximum ({self.credit_timeout_s:g} s)"
            )


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
    # Where a convolutional policy's forward pass runs (models.acting_device): auto (a GPU if torch
    # sees one), cpu, cuda or cuda:N. MLP and MinAtar-sized policies run in NumPy whatever it says.
    device: str = "auto"
    # C++ threads stepping an env that has them (the native Atari env); 0: the cores this process
    # is given (service.cores_given).
    env_threads: int = 0

    def __post_init__(self) -> None:
        if not re.fullmatch(DEVICE_PATTERN, self.device):
            raise ValueError(f"--device {self.device}: use auto, cpu, cuda or cuda:N")
        if self.env_threads < 0:
            raise ValueError("--env-threads must not be negative (0: the cores this process is given)")
