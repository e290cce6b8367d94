"""A real 2-process gloo world: replicas stay bit-identical while each rank trains its own data,
and a PBT copy lands identically on both."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rlmq.common.transport import free_port
from rlmq.learners.distributed import Placement, choose_device

HELPER = Path(__file__).parent / "helpers" / "ddp_rank.py"


def train_world(tmp_path: Path, encoder: str, backend: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """What each rank of tests/helpers/ddp_rank.py saved (`backend`: "" eager under DDP, else the
    captured update traced by that torch.compile backend)."""
    port, world, updates = free_port(), 2, 4
    outs = [tmp_path / f"{backend or 'eager'}-rank{r}.pt" for r in range(world)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(HELPER), str(r), str(world), str(port), str(updates), str(outs[r]), encoder, backend],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    for r, p in enumerate(procs):
        output, _ = p.communicate(timeout=240)
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{output}"
    a, b = (torch.load(o, weights_only=True) for o in outs)
    return a, b


World = Callable[..., tuple[dict[str, Any], dict[str, Any]]]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """`train_world`, each (encoder, backend) trained once for the module's tests."""
    trained: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]] = {}

    def train(encoder: str, backend: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
        if (encoder, backend) not in trained:
            trained[encoder, backend] = train_world(tmp_path_factory.mktemp("ddp"), encoder, backend)
        return trained[encoder, backend]

    return train


# Flat observations; byte images through a CNN and an LSTM, minibatches of whole slots.
@pytest.mark.parametrize("encoder", ["mlp", "minatar-lstm"])
def test_two_ranks_hold_bit_identical_parameters(world: World, encoder: str) -> None:
    a, b = world(encoder)
    assert a["moved"] > 0 and b["moved"] > 0, "the updates changed nothing"
    assert a["inactive_unmoved"] and b["inactive_unmoved"], "a member without data moved"
    for key in ("flat", "copied", "exp_avg", "exp_avg_sq", "steps"):  # the optimizers stay in sync too
        assert torch.equal(a[key], b[key]), f"{key} differs between ranks"
    # After the PBT copy, target member 2 holds exactly source member 0's weights and Adam state.
    assert torch.equal(a["copied"][2], a["copied"][0])


def test_captured_ranks_stay_in_step_and_train_as_ddp_does(world: World) -> None:
    """The captured update all-reduces on its own, between its compiled loss and step: the ranks'
    collectives stay in step through uneven and empty batches, and they train as the eager world
    under DDP does on the same data."""
    a, b = world("mlp", "aot_eager")
    for key in ("flat", "copied", "exp_avg", "exp_avg_sq", "steps"):
        assert torch.equal(a[key], b[key]), f"{key} differs between ranks"
    assert a["inactive_unmoved"] and a["moved"] > 0
    eager, _ = world("mlp")
    torch.testing.assert_close(a["flat"], eager["flat"], rtol=1e-4, atol=1e-5)
    assert torch.equal(a["steps"], eager["steps"])


def test_each_rank_gets_a_gpu_of_its_own_or_every_rank_trains_on_the_cpu() -> None:
    two_gpus, one_gpu, cpu_only = Placement(host=1, gpus=2), Placement(host=2, gpus=1), Placement(host=3, gpus=0)
    # Two ranks on a 2-GPU host and one on a 1-GPU host: the n-th rank on a host takes its n-th GPU.
    world = [two_gpus, one_gpu, two_gpus]
    assert [str(choose_device(req, r, world)) for req in ("auto", "cuda") for r in range(3)] == [
        "cuda:0",
        "cuda:0",
        "cuda:1",
    ] * 2
    # One host short of GPUs: "auto" puts every rank on the CPU (one backend for the world) ...
    for world in ([one_gpu, one_gpu], [two_gpus, cpu_only]):
        assert {str(choose_device("auto", r, world)) for r in range(2)} == {"cpu"}
    # ... and "cuda" says what to change instead of letting NCCL fail on a shared GPU.
    with pytest.raises(RuntimeError, match="2 learner ranks share a host with 1 GPU.*--device cpu"):
        choose_device("cuda", 0, [one_gpu, one_gpu])
    assert str(choose_device("cpu", 0, [two_gpus])) == "cpu"
    assert str(choose_device("cuda:1", 0, [two_gpus])) == "cuda:1"
