"""A real 2-process gloo world: replicas stay bit-identical while each rank trains on its own data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from rlmq.common.transport import free_port

HELPER = Path(__file__).parent / "helpers" / "ddp_rank.py"


def test_two_ranks_hold_bit_identical_parameters(tmp_path: Path) -> None:
    port, world, updates = free_port(), 2, 4
    outs = [tmp_path / f"rank{r}.pt" for r in range(world)]
    procs = [
        subprocess.Popen([sys.executable, str(HELPER), str(r), str(world), str(port), str(updates), str(outs[r])])
        for r in range(world)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    a, b = (torch.load(o, weights_only=True) for o in outs)
    assert a["moved"] > 0 and b["moved"] > 0, "the updates changed nothing"
    for name, tensor in a["params"].items():
        assert torch.equal(tensor, b["params"][name]), f"{name} differs between ranks"
    for index, state in a["optim"].items():  # Adam moments too: the optimizers stay in sync
        for key, value in state.items():
            assert torch.equal(value, b["optim"][index][key]), f"optimizer {index}.{key} differs"
