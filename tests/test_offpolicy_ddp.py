"""TD3 and DQN in a real 2-process gloo world (tests/helpers/offpolicy_rank.py), each rank training
on its own data: every network, target and optimizer state stays bit-identical across the ranks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlmq.common.transport import free_port

HELPER = Path(__file__).parent / "helpers" / "offpolicy_rank.py"


@pytest.mark.parametrize("max_steps_per_update", [0, 5])
@pytest.mark.parametrize("algo, networks", [("td3", 4), ("dqn", 2)])
def test_two_ranks_stay_bit_identical(tmp_path: Path, algo: str, networks: int, max_steps_per_update: int) -> None:
    """And with each update in chunks of 5 steps, the owed ones on no new data: every rank owes alike."""
    port, world = free_port(), 2
    outs = [tmp_path / f"rank{r}.pt" for r in range(world)]
    args = [str(max_steps_per_update)] if max_steps_per_update else []
    procs = [
        subprocess.Popen([sys.executable, str(HELPER), algo, str(r), str(world), str(port), "3", str(outs[r]), *args])
        for r in range(world)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    a, b = (torch.load(o, weights_only=True) for o in outs)
    assert a["moved"] > 0 and b["moved"] > 0, "training left a network of an active member unchanged"
    assert a["inactive_unmoved"] and b["inactive_unmoved"], "a member without data moved"
    assert a["copied"] and b["copied"], "the PBT copy missed a network"
    assert len(a["replicated"]) == networks
    assert a["chunks"] == b["chunks"] and (a["chunks"] > 4) == bool(max_steps_per_update), a["chunks"]
    for i, (x, y) in enumerate(zip(a["replicated"] + a["optimizers"], b["replicated"] + b["optimizers"], strict=True)):
        assert torch.equal(x, y), f"tensor {i} differs between ranks"
