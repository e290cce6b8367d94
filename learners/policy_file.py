"""The policy record: what `rlmq eval`, `rlmq export` and `rlmq.load_policy` read of a run.

One record, two places: `checkpoint.pt` in the run directory, which `rlmq up` writes at the end
from the weights the coordinator holds, and rank 0's learner checkpoints (learners/checkpoint.py),
which carry it beside the training state so that a run that never ended is read the same way.
On disk it is plain containers of tensors, ints, floats and strings (`torch.load(weights_only=True)`
reads it; never pickled code); `PolicyRecord.from_state` checks every field it reads.

torch is imported inside the functions that need it: `rlmq up` stays light until the run is over.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlmq.common.config import RunConfig
from rlmq.common.loading import from_mapping
from rlmq.common.schema import EnvSpec

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class MemberPolicy:
    """One member's newest weights and where they came from."""

    params: dict[str, np.ndarray]
    version: int
    trained_steps: int  # env steps the weights were trained on
    hyperparams: dict[str, float] = field(default_factory=dict)
    generation: int = 0  # PBT's: 1 + its source's at each exploit (the coordinator's to know)
    parent: int = -1  # the member it copied at its last exploit; -1: none (or not known here)


@dataclass(frozen=True)
class PolicyRecord:
    members: dict[int, MemberPolicy]
    best_member: int
    env_spec: EnvSpec
    run_config: RunConfig

    def __post_init__(self) -> None:
        if self.best_member not in self.members:
            raise ValueError(f"best member {self.best_member} is not among members {sorted(self.members)}")

    def to_state(self) -> dict[str, Any]:
        """The record as `torch.save` stores it. "params" and "version" repeat the best member's for
        readers of a single policy; torch.save stores each tensor's storage once."""
        import torch

        members = {
            m: {
                "params": {k: torch.from_numpy(np.array(v, copy=True)) for k, v in p.params.items()},
                "version": p.version,
                "trained_steps": p.trained_steps,
                "hyperparams": {k: float(v) for k, v in p.hyperparams.items()},
                "generation": p.generation,
                "parent": p.parent,
            }
            for m, p in self.members.items()
        }
        return {
            "params": members[self.best_member]["params"],
            "version": members[self.best_member]["version"],
            "best_member": self.best_member,
            "members": members,
            "env_spec": dataclasses.asdict(self.env_spec),
            "run_config": json.loads(json.dumps(dataclasses.asdict(self.run_config))),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> PolicyRecord:
        """The record in a loaded checkpoint; KeyError, TypeError or ValueError where it is not one."""

        def member(saved: dict[str, Any]) -> MemberPolicy:
            params: dict[str, torch.Tensor] = saved["params"]
            return MemberPolicy(
                params={str(k): v.numpy() for k, v in params.items()},
                version=int(saved["version"]),
                trained_steps=int(saved.get("trained_steps", 0)),
                hyperparams={str(k): float(v) for k, v in saved.get("hyperparams", {}).items()},
                generation=int(saved.get("generation", 0)),
                parent=int(saved.get("parent", -1)),
            )

        return cls(
            members={int(m): member(saved) for m, saved in state["members"].items()},
            best_member=int(state["best_member"]),
            env_spec=from_mapping(EnvSpec, state["env_spec"]),
            run_config=from_mapping(RunConfig, state["run_config"]),
        )


def load(file: Path) -> PolicyRecord:
    """The policy record in `checkpoint.pt` or a rank-0 learner checkpoint; ValueError naming the
    file where it holds none."""
    import torch  # torch.load with weights_only: tensors and plain containers, never pickled code

    try:
        return PolicyRecord.from_state(torch.load(file, map_location="cpu", weights_only=True))
    except ValueError as exc:
        raise ValueError(f"{file}: {exc}") from exc
    except Exception as exc:  # torch.load's unpickling errors, a missing key, a wrong type: not one of ours
        raise ValueError(f"{file} is not a checkpoint of rlmq up ({type(exc).__name__}: {exc})") from exc
