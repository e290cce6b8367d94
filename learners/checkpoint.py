"""Learner checkpoints: every rank's whole training state, written together and restored together.

A checkpoint holds what a learner world needs to carry on as if it had never stopped: each member's
weights and every optimizer's moments and step counts, the normalization statistics, the policy
versions, the PBT decisions applied and the hyperparameters they set, and the rank's own replay
shard and random streams. What a class must save it names once, in a `STATE` tuple of its
attribute names; `capture` walks those into plain containers of CPU tensors, `restore` copies them
back in place (a tensor keeps its identity: the optimizers hold references to the parameters).

On disk: `ROOT/rank{r}/{n:08d}.pt`, one file per rank and checkpoint, written to a temporary name
and renamed (atomic), read with `torch.load(weights_only=True)`: tensors and plain containers, never
pickled code. Each rank has a directory of its own, so that on Kubernetes each learner pod may keep
its checkpoints on its own volume. Rank 0's file also carries the policy record that `rlmq eval` and
`rlmq export` read from `checkpoint.pt` (learners/policy_file.py), so either reads it as it is.

The world agrees on what it writes and what it loads, with a collective each time: checkpoint n is
complete when every rank has written it, and only then does a rank prune its files beyond the
newest `kept` (`write_everywhere`); a starting world loads the newest n that every rank holds
(`newest_everywhere`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec
from rlmq.learners import distributed
from rlmq.learners.policy_file import MemberPolicy, PolicyRecord

log = logging.getLogger("rlmq.learner")
FORMAT = 1
_NAME = re.compile(r"^(\d{8})\.pt$")


def capture(obj: Any) -> Any:
    """`obj`'s state as plain containers of CPU tensors, what `torch.load(weights_only=True)` reads
    back. An object is walked through its class's `STATE` attribute names."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    if isinstance(obj, torch.Generator):
        return obj.get_state()
    if isinstance(obj, np.random.Generator):  # its state holds 128-bit integers: kept as JSON text
        return {"bit_generator": json.dumps(obj.bit_generator.state)}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple)):
        return [capture(value) for value in obj]
    if isinstance(obj, dict):
        return {str(key): capture(value) for key, value in obj.items()}
    fields = getattr(type(obj), "STATE", None)
    if fields is None:
        raise TypeError(f"{type(obj).__name__} declares no STATE to checkpoint")
    return {name: capture(getattr(obj, name)) for name in fields}


def restore(obj: Any, saved: Any, path: str = "state") -> Any:
    """Load `saved` (from `capture`) into `obj`: tensors, arrays and generators in place; returns
    what the attribute holding `obj` should hold (the same object, or the saved number or list).
    ValueError, naming the attribute's dotted path, where the saved state does not fit `obj`: a
    checkpoint of another config."""
    if isinstance(obj, torch.Tensor):
        _check(
            isinstance(saved, torch.Tensor) and saved.shape == obj.shape and saved.dtype == obj.dtype, path, obj, saved
        )
        with torch.no_grad():
            obj.copy_(saved)
        return obj
    if isinstance(obj, np.ndarray):
        _check(
            isinstance(saved, torch.Tensor) and tuple(saved.shape) == obj.shape and saved.numpy().dtype == obj.dtype,
            path,
            obj,
            saved,
        )
        obj[...] = saved.numpy()
        return obj
    if isinstance(obj, torch.Generator):
        _check(isinstance(saved, torch.Tensor), path, obj, saved)
        obj.set_state(saved)
        return obj
    if isinstance(obj, np.random.Generator):
        _check(isinstance(saved, dict) and "bit_generator" in saved, path, obj, saved)
        obj.bit_generator.state = json.loads(saved["bit_generator"])
        return obj
    if obj is None or isinstance(obj, (bool, int, float, str)):
        _check(type(saved) is type(obj) or (isinstance(obj, float) and isinstance(saved, int)), path, obj, saved)
        return saved
    if isinstance(obj, (list, tuple)):
        _check(isinstance(saved, list) and len(saved) == len(obj), path, obj, saved)
        restored = [restore(value, s, f"{path}[{i}]") for i, (value, s) in enumerate(zip(obj, saved, strict=True))]
        return type(obj)(restored)
    if isinstance(obj, dict):
        _check(isinstance(saved, dict) and set(saved) == {str(key) for key in obj}, path, obj, saved)
        for key in obj:
            obj[key] = restore(obj[key], saved[str(key)], f"{path}.{key}")
        return obj
    _check(isinstance(saved, dict) and set(saved) == set(type(obj).STATE), path, obj, saved)
    for name in type(obj).STATE:
        setattr(obj, name, restore(getattr(obj, name), saved[name], f"{path}.{name}"))
    return obj


def _check(fits: bool, path: str, obj: Any, saved: Any) -> None:
    if not fits:
        raise ValueError(f"{path}: the checkpoint holds {_describe(saved)}, this run {_describe(obj)}")


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)}"
    if isinstance(value, dict):
        return f"fields {sorted(map(str, value))}"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    return type(value).__name__


def free_bytes(path: Path) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


class DiskRefused(Exception):
    """A rank's disk refused its checkpoint (full, or not writable): the run cannot keep its state,
    and a restarted world would meet the same disk. The message names the path and the error."""


class Checkpoints:
    """One rank's checkpoint files: `ROOT/rank{r}/{n:08d}.pt`."""

    def __init__(self, root: Path, rank: int, kept: int) -> None:
        self.dir, self.kept = root / f"rank{rank}", kept
        self.refused = ""  # why the disk refused the last write ("": it did not)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            for leftover in self.dir.glob(".*.tmp"):  # a write a crash cut short
                leftover.unlink(missing_ok=True)
        except OSError as exc:
            raise DiskRefused(f"cannot write checkpoints to {self.dir}: {exc.strerror or exc}") from exc

    def latest(self) -> int:
        """The newest complete checkpoint's number; -1: none."""
        return max(numbers(self.dir), default=-1)

    def path(self, n: int) -> Path:
        return self.dir / f"{n:08d}.pt"

    def write(self, n: int, state: dict[str, Any]) -> bool:
        """Checkpoint n, atomically; False when the disk refuses it (`refused` says why)."""
        tmp = self.dir / f".{n:08d}.tmp"
        try:
            torch.save({"format": FORMAT, "number": n, **state}, tmp)
            os.replace(tmp, self.path(n))
            return True
        except (OSError, RuntimeError) as exc:  # torch's zip writer reports a failed write as a RuntimeError
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            free = free_bytes(self.dir)
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "the write failed"
            self.refused = f"cannot write checkpoint {self.path(n)}: {why} ({free / 2**20:.1f} MiB free there)"
            return False

    def load(self, n: int) -> dict[str, Any]:
        state: dict[str, Any] = torch.load(self.path(n), map_location="cpu", weights_only=True)
        if state.get("format") != FORMAT:
            raise ValueError(f"{self.path(n)}: checkpoint format {state.get('format')}, this rlmq reads {FORMAT}")
        return state

    def prune(self, complete: int) -> None:
        """Keep the newest `kept` of the checkpoints up to `complete` (every rank has it), and any
        after it (being written: not ours to judge)."""
        old = [n for n in numbers(self.dir) if n <= complete][: -self.kept]
        for n in old:
            self.path(n).unlink(missing_ok=True)


def newest_everywhere(files: Checkpoints | None, device: torch.device) -> tuple[int, int]:
    """(the newest checkpoint every rank holds, -1 if there is none; the newest any rank holds,
    past which the world numbers its next ones, so that no file is overwritten). A collective."""
    oldest, newest = distributed.extremes(files.latest() if files is not None else -1, device)
    if oldest < 0:
        return -1, newest
    held, _ = distributed.extremes(int(files is not None and files.path(oldest).exists()), device)
    if not held:  # pruned on some rank since (a world that died mid-prune): not a state to resume
        log.warning("checkpoint %d is not on every rank any more", oldest)
        return -1, newest
    return oldest, newest


def write_everywhere(files: Checkpoints | None, number: int, state: dict[str, Any], device: torch.device) -> bool:
    """Every rank writes checkpoint `number`; once all have (a collective says so), each prunes its
    oldest. False if some rank did not write it (logged, unless no rank keeps checkpoints): the last
    complete one stands."""
    written = files is not None and files.write(number, state)
    refused = files is not None and bool(files.refused) and not written
    everywhere, somewhere = distributed.extremes(int(written), device)
    _, anywhere_refused = distributed.extremes(int(refused), device)
    if anywhere_refused:  # every rank stops alike: the last complete checkpoint stands
        raise DiskRefused(
            files.refused
            if refused and files is not None
            else f"stops: another rank cannot write checkpoint {number} (its log says why)"
        )
    if not everywhere:
        if somewhere:
            log.warning("checkpoint %d was not written on every rank: the last complete one stands", number)
        return False
    assert files is not None
    files.prune(number)
    return True


def record(
    trainer: Any,
    versions: list[int],
    pbt: dict[str, Any],
    rank: int,
    world_size: int,
    run_config: RunConfig,
    spec: EnvSpec,
    hyperparams: list[dict[str, float]],
) -> dict[str, Any]:
    """A rank's checkpoint: its `trainer`'s whole state (`capture`) and the learner's (policy
    `versions`, the `pbt` state); rank 0's also what `rlmq eval` and `rlmq export` read in
    checkpoint.pt, the policy record (learners/policy_file.py)."""
    state: dict[str, Any] = {
        "learner": {"versions": list(versions), **pbt, "rank": rank, "world_size": world_size, "time": time.time()},
        "trainer": capture(trainer),
    }
    if rank == 0:
        record = PolicyRecord(
            members={
                m: MemberPolicy(trainer.member_params(m), versions[m], trainer.trained_steps(m), hyperparams[m])
                for m in range(run_config.population)
            },
            best_member=0,  # fitness is the coordinator's to judge
            env_spec=spec,
            run_config=run_config,
        )
        state |= record.to_state()
    return state


def numbers(directory: Path) -> list[int]:
    """The complete checkpoints in one rank's directory, oldest first."""
    return sorted(int(m.group(1)) for p in directory.iterdir() if (m := _NAME.match(p.name)))


def latest_file(root: Path) -> Path | None:
    """Rank 0's newest checkpoint under a run's checkpoint root (what `rlmq eval` reads)."""
    rank0 = root / "rank0"
    found = numbers(rank0) if rank0.is_dir() else []
    return rank0 / f"{found[-1]:08d}.pt" if found else None
