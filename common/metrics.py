"""Every Prometheus metric rlmq exports, prefix `rlmq_`, each documented once (its help text).

A process creates only its own role's set (`ActorMetrics()` etc.) and serves it on its own
/metrics port. Counters are exported with prometheus_client's `_total` suffix (so
`rlmq_actor_env_steps` is scraped as `rlmq_actor_env_steps_total`), histograms as `_bucket`,
`_sum` and `_count`. `rlmq up` lists every process it starts for Prometheus in the run
directory's `prometheus_targets.json` (file_sd, labels `role` and `run`); the dashboards in
deploy/grafana/ use only these metrics (tests/test_observability.py holds them to it).
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Iterable, Sequence

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

PREFIX = "rlmq"


def serve(registry: CollectorRegistry, port: int, host: str = "*") -> int:
    """Serve /metrics on `host` ("*": every interface); port 0 picks a free one, -1 serves
    nothing. A port taken by someone else is given up for a free one (the process announces what
    it bound: service.announce), never a reason to fail. Returns the port (0 if none)."""
    if port < 0:
        return 0
    addr = "0.0.0.0" if host == "*" else host
    try:
        server, _thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        if port == 0 or exc.errno != errno.EADDRINUSE:
            raise
        server, _thread = start_http_server(0, addr=addr, registry=registry)
        logging.getLogger("rlmq").warning(
            "metrics port %d is taken; serving /metrics on %d instead", port, server.server_port
        )
    return int(server.server_port)


def _rejected(registry: CollectorRegistry) -> Counter:
    return Counter(
        f"{PREFIX}_rejected_messages",
        "Malformed or invalid messages dropped, by reason.",
        ["reason"],
        registry=registry,
    )


class Heartbeat:
    """`rlmq_loop_heartbeat_timestamp_seconds`: liveness for probes (`rlmq check`) and dashboards.

    `beat()` is called on every iteration of a service loop; it costs one monotonic clock read
    and writes the gauge at most once per `period_s`. The gauge is 0 until the loop first runs
    (the process is still registering or starting up).
    """

    def __init__(self, registry: CollectorRegistry, period_s: float = 1.0) -> None:
        self.gauge = Gauge(
            f"{PREFIX}_loop_heartbeat_timestamp_seconds",
            "Unix time of the service loop's latest iteration (written at most once a second; "
            "0 until the loop first runs).",
            registry=registry,
        )
        self.period_s = period_s
        self._next = 0.0

    def beat(self) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.period_s
            self.gauge.set(time.time())


class BatchHistogram(Collector):
    """A label-free histogram that takes a whole array of observations per call.

    prometheus_client's Histogram takes one value per call, under a lock: at the tens of thousands
    of short episodes a second a fresh CartPole policy ends, that is a visible share of an actor's
    time (benchmarks/LOG.md §1). Exported as
    prometheus_client exports a Histogram: cumulative `_bucket`s, and `_count`/`_sum` only when
    every bucket bound is ≥ 0.
    """

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = np.asarray(sorted(buckets), np.float64)
        self.counts = np.zeros(len(self.bounds) + 1, np.int64)  # per bucket, not cumulative; last: +Inf
        self.sum = 0.0
        self._lock = threading.Lock()  # the /metrics thread reads while the service observes
        registry.register(self)

    def observe_many(self, values: np.ndarray) -> None:
        # side="left": a value equal to a bound belongs to that bound's bucket (le is ≤).
        counts = np.bincount(np.searchsorted(self.bounds, values, side="left"), minlength=len(self.counts))
        with self._lock:
            self.counts += counts
            self.sum += float(np.sum(values))

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation)]

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            cumulative, total = np.cumsum(self.counts).tolist(), self.sum
        family = HistogramMetricFamily(self.name, self.documentation)
        bounds = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        family.add_metric([], list(zip(bounds, cumulative, strict=True)), sum_value=total)
        return [family]


class ActorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.env_steps = Counter(f"{PREFIX}_actor_env_steps", "Env steps taken.", registry=r)
        self.episodes = Counter(f"{PREFIX}_actor_episodes", "Episodes finished.", registry=r)
        # Returns can be negative, so no `_sum` is exported (nor a mean; as prometheus_client's
        # Histogram): use the buckets' quantiles, or the coordinator's rlmq_member_fitness.
        self.episode_return = BatchHistogram(
            f"{PREFIX}_actor_episode_return",
            "Undiscounted return of finished episodes.",
            buckets=(-1000, -500, -200, -100, 0, 10, 50, 100, 200, 300, 400, 475, 500, 1000),
            registry=r,
        )
        # The actor's time blocked on send: it sends a rollout only with a learner's credit in
        # hand (the socket itself never fills: credits bound what is in flight), so waiting for
        # a send is waiting for a credit.
        self.credit_wait = Counter(
            f"{PREFIX}_actor_credit_wait_seconds",
            "Time spent waiting for a learner's credit before collecting a rollout (backpressure: "
            "the actor's time blocked on send).",
            registry=r,
        )
        # With the credit wait, where an actor's time goes: choosing actions (the policy's forward
        # pass, on a CPU core or a GPU) and waiting for its envs to step.
        self.acting = Counter(
            f"{PREFIX}_actor_acting_seconds",
            "Time spent choosing actions while collecting (the policy's forward pass).",
            registry=r,
        )
        self.env_wait = Counter(
            f"{PREFIX}_actor_env_wait_seconds", "Time spent waiting for the envs to step while collecting.", registry=r
        )
        self.policy_version = Gauge(f"{PREFIX}_actor_policy_version", "Version of the weights in use.", registry=r)
        self.returns_given_up = Counter(
            f"{PREFIX}_actor_returns_given_up",
            "Episode returns dropped unacknowledged: more waited for the coordinator than the bound "
            "(their env steps and episodes are still counted).",
            registry=r,
        )
        self.rejected = _rejected(r)
        self.heartbeat = Heartbeat(r)


class LearnerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.samples = Counter(f"{PREFIX}_learner_samples", "Env steps trained on.", registry=r)
        self.received = Counter(
            f"{PREFIX}_learner_received_steps",
            "Env steps of the rollouts received and accepted (before the policy-lag gate).",
            registry=r,
        )
        self.updates = Counter(f"{PREFIX}_learner_updates", "Updates applied.", registry=r)
        self.stale_dropped = Counter(
            f"{PREFIX}_learner_stale_dropped",
            "Rollouts dropped because their policy lag exceeded max_policy_lag.",
            registry=r,
        )
        self.policy_lag = Histogram(
            f"{PREFIX}_learner_policy_lag",
            "Updates between the policy that acted and the policy that learns.",
            buckets=(0, 1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.idle_requests = Gauge(
            f"{PREFIX}_learner_idle_credit_requests",
            "Identities holding credit requests they do not use: asking again after a probation credit "
            "was taken back unused.",
            registry=r,
        )
        self.queue_depth = Gauge(f"{PREFIX}_learner_queue_depth", "Rollouts received and waiting.", registry=r)
        self.weights_sent = Counter(
            f"{PREFIX}_learner_weights_sent_bytes",
            "Bytes of weights sent to actors, each just ahead of a credit naming their version.",
            registry=r,
        )
        self.update_seconds = Histogram(
            f"{PREFIX}_learner_update_seconds",
            "Wall time of one update (all epochs).",
            # Up to a minute: an off-policy population's whole update on a CPU core takes tens of seconds.
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.loss = Gauge(f"{PREFIX}_learner_loss", "Last update's losses.", ["term"], registry=r)
        self.checkpoint_seconds = Histogram(
            f"{PREFIX}_learner_checkpoint_seconds",
            "Wall time of one checkpoint, from writing this rank's file to every rank having written its own.",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 10, 30),
            registry=r,
        )
        self.nonfinite_skipped = Counter(
            f"{PREFIX}_learner_nonfinite_skipped",
            "Optimizer steps of a member skipped because its gradient (after the all-reduce) was "
            "not finite; its weights kept their values.",
            registry=r,
        )
        self.rejected = _rejected(r)
        self.heartbeat = Heartbeat(r)


class CoordinatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.env_steps = Counter(f"{PREFIX}_env_steps", "Env steps summed over all actors.", registry=r)
        self.episodes = Counter(f"{PREFIX}_episodes", "Episodes reported.", registry=r)
        self.member_fitness = Gauge(
            f"{PREFIX}_member_fitness",
            "Mean return of the member's last 100 episodes.",
            ["member"],
            registry=r,
        )
        self.evaluated_return = Gauge(
            f"{PREFIX}_member_evaluated_return",
            "Mean return of the member's latest evaluation by the run's own evaluator (the verdict).",
            ["member"],
            registry=r,
        )
        self.evaluations = Counter(
            f"{PREFIX}_evaluations",
            "Evaluations by the run's own evaluator, by outcome (played, failed).",
            ["outcome"],
            registry=r,
        )
        self.member_env_steps = Counter(
            f"{PREFIX}_member_env_steps",
            "Env steps collected for the member.",
            ["member"],
            registry=r,
        )
        self.member_generation = Gauge(
            f"{PREFIX}_member_generation",
            "PBT generation of the member's weights (its source's + 1 at each exploit).",
            ["member"],
            registry=r,
        )
        self.member_hyperparameter = Gauge(
            f"{PREFIX}_member_hyperparameter",
            "The member's current hyperparameters (PBT perturbs those given a range).",
            ["member", "name"],
            registry=r,
        )
        self.cem_spread = Gauge(
            f"{PREFIX}_cem_spread",
            "CEM-RL's search distribution after the last generation: its mean standard deviation over "
            "the actor's weights (0 outside method cem).",
            registry=r,
        )
        self.dvd_weight = Gauge(
            f"{PREFIX}_dvd_weight",
            "DvD's diversity weight λ as the adaptive bandit last chose it (0 until it chooses).",
            registry=r,
        )
        self.pbt_decisions = Counter(
            f"{PREFIX}_pbt_decisions",
            "PBT decisions applied, by selection rule and kind (exploit: copied another member; "
            "explore: perturbed its own hyperparameters), and CEM-RL generations (selection cem, kind generation).",
            ["selection", "kind"],
            registry=r,
        )
        self.weights_latency = Histogram(
            f"{PREFIX}_weights_store_seconds",
            "From learner rank 0's Weights arriving to their Redis copy written (decoding and checks included).",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
            registry=r,
        )
        # Two gauges rather than a `role` label: Prometheus' targets carry `role` (the scraped
        # process's), and a metric label of that name would be renamed `exported_role`.
        self.connected_actors = Gauge(f"{PREFIX}_connected_actors", "Actors heard from recently.", registry=r)
        self.connected_learners = Gauge(
            f"{PREFIX}_connected_learners", "Learner ranks of the current world heard from lately.", registry=r
        )
        self.learner_behind = Gauge(
            f"{PREFIX}_learner_behind",
            "1 while the learner rank holds the world up: silent (stopped, hung or dead), or "
            "waited for in a collective by the other ranks (coordinator/stragglers.py).",
            ["rank"],
            registry=r,
        )
        self.rejected = _rejected(r)
        self.heartbeat = Heartbeat(r)

    def show_population(
        self,
        member_means: dict[str, float | None],
        members: dict[int, tuple[int, dict[str, float]]],
        cem_spread: float | None,
        dvd_weight: float | None,
    ) -> None:
        """The population's gauges, each tick: fitness (None: no episode yet), each member's
        (generation, hyperparameters), and CEM-RL's spread or DvD's weight once chosen."""
        for member, value in member_means.items():
            if value is not None:
                self.member_fitness.labels(member).set(value)
        for m, (generation, hyperparams) in members.items():
            self.member_generation.labels(str(m)).set(generation)
            for name, value in hyperparams.items():
                self.member_hyperparameter.labels(str(m), name).set(value)
        if cem_spread is not None:
            self.cem_spread.set(cem_spread)
        if dvd_weight is not None:
            self.dvd_weight.set(dvd_weight)
