"""The messages a learner sends an actor for one credit: the member's weights of the version the
credit names, once per actor and version, then the credit itself, on the same connection.

This is how actors get weights (but for the coordinator's Assign): each copy goes to an actor about
to collect with it, so the traffic follows the rollouts trained on, not the fleet's size
(docs/architecture.md, "weights go only with credits"). Every rank holds the same weights, so every
rank sends them. The weights are encoded once per version, however many actors it goes to.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from rlmq.common import wire

MAX_ACTORS_REMEMBERED = 4096  # actors whose last weights sent we remember (restarted ones are new)


class CreditMessages:
    """Encoded weights kept per version, and which version each actor was sent. The caller names
    the member's version now; `encode_weights` encodes the weights it holds now, of that version."""

    def __init__(self, encode_weights: Callable[[int], bytes]) -> None:
        self.encode_weights = encode_weights  # member → its current weights, encoded
        self.weights: dict[int, tuple[int, bytes]] = {}  # member → (version, its Weights, encoded)
        self.sent: collections.OrderedDict[bytes, tuple[int, int]] = collections.OrderedDict()  # actor → (m, v)
        self.credit = (-1, b"")  # (version, a Credit naming it)

    def encoded_weights(self, member: int, version: int) -> bytes:
        """The member's weights, encoded once per version."""
        if self.weights.get(member, (-1, b""))[0] != version:
            self.weights[member] = (version, self.encode_weights(member))
        return self.weights[member][1]

    def for_credit(self, actor: bytes, member: int, version: int) -> list[bytes]:
        """The encoded messages to send the actor, in order: the weights unless it has them, then a credit."""
        messages = []
        if self.sent.get(actor) != (member, version):
            messages.append(self.encoded_weights(member, version))
            self.sent[actor] = (member, version)
            self.sent.move_to_end(actor)
            if len(self.sent) > MAX_ACTORS_REMEMBERED:
                self.sent.popitem(last=False)
        if self.credit[0] != version:
            self.credit = (version, wire.encode(wire.Credit(1, policy_version=version)))
        messages.append(self.credit[1])
        return messages
