"""Which weights an actor collects with. Two sources bring them: the coordinator's Assign (at
start, and again when the actor asks, holding none that fit), and a learner's credit, which its
current weights precede. This decides which to adopt; no sockets here.
"""

from __future__ import annotations

from typing import Literal

from rlmq.common import wire
from rlmq.common.config import RunConfig
from rlmq.common.models import NumpyPolicy, make_policy
from rlmq.common.schema import EnvSpec

Source = Literal["learner", "assign"]


class HeldPolicy:
    """The member's weights an actor holds, as a NumPy policy (an image policy's forward on the GPU
    `device`, if any: models.acting_device), and their version (−1: none yet)."""

    def __init__(self, run_config: RunConfig, spec: EnvSpec, member: int, device: str | None = None) -> None:
        self.run_config, self.spec, self.member, self.device = run_config, spec, member, device
        self.policy: NumpyPolicy | None = None
        self.version = -1
        self.copied_by = 0  # the PBT decision whose copy the weights descend from (wire.Weights)

    def offer(self, weights: wire.Weights, source: Source) -> bool:
        """Adopt these weights if the rules for their source say so; True if adopted.

        learner: different from ours, newer or not: a learner sends what it holds now with its
            credit, and a restarted learner world counts on from the last version its predecessor
            published, older than one we may have been sent.
        assign: only while we hold none (the coordinator's copy is never newer than a learner's).

        Raises WireError for another member's weights, or weights that do not fit the policy
        (the policy held before stays)."""
        if weights.member != self.member:
            raise wire.WireError("unknown_member", f"weights of member {weights.member}, we collect for {self.member}")
        wanted = weights.version != self.version if source == "learner" else self.policy is None
        if wanted:
            self.adopt(weights)
        return wanted

    def adopt(self, weights: wire.Weights) -> None:
        """Build the policy; WireError("bad_weights") leaves the policy held before in place."""
        try:
            policy = make_policy(
                self.run_config, dict(weights.params), self.spec, weights.trained_steps, self.device, weights.activation
            )
        except (KeyError, ValueError) as exc:
            raise wire.WireError("bad_weights", str(exc)) from exc
        self.policy, self.version, self.copied_by = policy, weights.version, weights.copied_by
