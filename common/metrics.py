"""Every Prometheus metric rlmq exports, prefix `rlmq_`, each documented once.

A process creates only its own role's set (`ActorMetrics()` etc.) and serves it on its own
/metrics port.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

PREFIX = "rlmq"


def serve(registry: CollectorRegistry, port: int) -> int:
    """Serve /metrics; port 0 picks a free one, -1 serves nothing. Returns the port (0 if none)."""
    if port < 0:
        return 0
    server, _thread = start_http_server(port, addr="0.0.0.0", registry=registry)
    return int(server.server_port)


def _rejected(registry: CollectorRegistry) -> Counter:
    return Counter(
        f"{PREFIX}_rejected_messages",
        "Malformed or invalid messages dropped, by reason.",
        ["reason"],
        registry=registry,
    )


class ActorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.env_steps = Counter(f"{PREFIX}_actor_env_steps", "Env steps taken.", registry=r)
        self.episodes = Counter(f"{PREFIX}_actor_episodes", "Episodes finished.", registry=r)
        self.episode_return = Histogram(
            f"{PREFIX}_actor_episode_return",
            "Undiscounted return of finished episodes.",
            buckets=(-1000, -500, -200, -100, 0, 10, 50, 100, 200, 300, 400, 475, 500, 1000),
            registry=r,
        )
        self.credit_wait = Counter(
            f"{PREFIX}_actor_credit_wait_seconds",
            "Time spent waiting for a learner's credit before collecting a rollout (backpressure).",
            registry=r,
        )
        self.policy_version = Gauge(
            f"{PREFIX}_actor_policy_version", "Version of the weights in use.", registry=r
        )
        self.rejected = _rejected(r)


class LearnerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.samples = Counter(f"{PREFIX}_learner_samples", "Env steps trained on.", registry=r)
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
        self.queue_depth = Gauge(
            f"{PREFIX}_learner_queue_depth", "Rollouts received and waiting.", registry=r
        )
        self.update_seconds = Histogram(
            f"{PREFIX}_learner_update_seconds",
            "Wall time of one update (all epochs).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.loss = Gauge(f"{PREFIX}_learner_loss", "Last update's losses.", ["term"], registry=r)
        self.rejected = _rejected(r)


class CoordinatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.env_steps = Counter(
            f"{PREFIX}_env_steps", "Env steps summed over all actors.", registry=r
        )
        self.episodes = Counter(f"{PREFIX}_episodes", "Episodes reported.", registry=r)
        self.member_fitness = Gauge(
            f"{PREFIX}_member_fitness",
            "Mean return of the member's last 100 episodes.",
            ["member"],
            registry=r,
        )
        self.weights_bytes = Counter(
            f"{PREFIX}_weights_broadcast_bytes", "Bytes of weights rebroadcast.", registry=r
        )
        self.weights_latency = Histogram(
            f"{PREFIX}_weights_broadcast_seconds",
            "From a learner's Weights arriving to their rebroadcast (Redis write included).",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
            registry=r,
        )
        self.connected = Gauge(
            f"{PREFIX}_connected", "Processes heard from recently.", ["role"], registry=r
        )
        self.rejected = _rejected(r)
