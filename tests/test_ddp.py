"""A real 2-process gloo world: replicas stay bit-identical while each rank trains its own data,
and a PBT copy lands identically on both."""

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
    assert a["inactive_unmoved"] and b["inactive_unmoved"], "a member without data moved"
    for key in ("flat", "copied", "exp_avg", "exp_avg_sq", "steps"):  # the optimizers stay in sync too
        assert torch.equal(a[key], b[key]), f"{key} differs between ranks"
    # After the PBT copy, target member 2 holds exactly source member 0's weights and Adam state.
    assert torch.equal(a["copied"][2], a["copied"][0])
