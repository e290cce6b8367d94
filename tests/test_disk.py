"""A run directory on a disk that fills (issue 41): one `error:` line naming it, exit 1, nothing
corrupted, and `rlmq up --resume` goes on once space is freed; a final checkpoint the disk refuses
is said the same way. Real tmpfs mounts (needs root)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlmq.cli.supervisor import Supervisor
from rlmq.cli.upconfig import UpConfig
from rlmq.common.service import EXIT_DISK
from tests.helpers.procs import start_up, wait_for, wait_until_stepping

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def fill(path: Path) -> None:
    """Write zeros to `path` until its disk has no room left."""
    block = bytes(1 << 16)
    with open(path, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(block)


@needs_root
@pytest.mark.slow
def test_a_run_whose_disk_fills_ends_with_one_error_line_and_resumes_once_space_is_freed(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(disk)], check=True)
    try:
        run_dir = disk / "run"
        up = start_up(
            run_dir, "--actors", "2", "--learners", "1", "--checkpoint-every", "1", "--total-steps", "100000000"
        )
        try:
            wait_until_stepping(run_dir, up)
            checkpoints = run_dir / "checkpoints" / "rank0"
            wait_for(lambda: list(checkpoints.glob("*.pt")), 30, "a checkpoint", up)
            fill(disk / "filler")
            out, _ = up.communicate(timeout=90)
        finally:
            if up.poll() is None:
                up.kill()
                up.wait()
        assert up.returncode == 1, out
        assert "Traceback" not in out, out
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, out
        print(errors[0])
        assert "cannot write" in errors[0] and f"free space on the disk of {run_dir}" in errors[0], errors[0]
        assert f"rlmq up --resume {run_dir}" in errors[0], errors[0]
        kept = sorted(checkpoints.glob("*.pt"))
        assert kept and not list(checkpoints.glob(".*.tmp")), kept
        for file in kept:  # every checkpoint left whole
            torch.load(file, weights_only=True)
        (disk / "filler").unlink()
        steps = int(re.findall(r"env steps\s+([\d,]+)", out)[-1].replace(",", ""))
        resumed = subprocess.run(
            [
                sys.executable,
                "-m",
                "rlmq.cli",
                "up",
                "--resume",
                str(run_dir),
                "--actors",
                "2",
                "--total-steps",
                str(steps + 5_000),
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert "resumed from checkpoint" in (run_dir / "logs" / "learner-0.log").read_text()
        assert (run_dir / "summary.json").is_file()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@needs_root
@pytest.mark.slow
def test_a_final_checkpoint_the_disk_refuses_is_said_though_the_run_reached_its_budget(tmp_path: Path) -> None:
    """The learner writes its final checkpoint after the final weights, so the coordinator may end
    the run before the learner's disk refuses it: `rlmq up` still says so, in one line."""
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(checkpoints)], check=True)
    try:
        # No checkpoint before the end (one a minute by default): the final one is the first.
        up = subprocess.run(
            [sys.executable, "-m", "rlmq.cli", "up", "--run-dir", str(run_dir), "--actors", "1"]
            + ["--learners", "1", "--total-steps", "2000"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        out = up.stdout + up.stderr
        assert up.returncode == 1, out
        assert "Traceback" not in out, out
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "cannot write" in errors[0], out
        assert f"rlmq up --resume {run_dir}" in errors[0], errors[0]
        assert not list(checkpoints.rglob("*.pt")) and not list(checkpoints.rglob(".*.tmp"))
        assert "stopping at once" not in (run_dir / "logs" / "learner-0.log").read_text()
    finally:
        subprocess.run(["umount", "-l", str(checkpoints)], check=False)


def test_a_learner_whose_disk_refused_after_the_coordinator_ended_fails_the_run(tmp_path: Path) -> None:
    """The order the run above cannot force: the coordinator is done ("over") before the learner
    exits with EXIT_DISK. What `rlmq up` checks once its children have stopped."""
    cfg = UpConfig.build(
        actors=1, learners=1, config=None, overrides={}, redis_url=None, run_dir=tmp_path, torch_threads=1
    )
    supervisor = Supervisor(cfg, "redis://127.0.0.1:1/0", None)
    supervisor.plan()
    supervisor.sockets.remove()  # nothing is started: the children below only exit
    for child in supervisor.children:
        code = EXIT_DISK if child.role == "learner" else 0
        child.log_path = supervisor.log_dir / f"{child.name}.log"  # as `spawn` names it
        child.process = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
        child.process.wait()
    learner = next(c for c in supervisor.children if c.role == "learner")
    assert supervisor.final_checkpoint_refused() == (  # its log says nothing yet: the exit code
        f"failed: learner-0 exited with {EXIT_DISK}; free space on the disk of {tmp_path} (or make it writable), "
        f"then go on with `rlmq up --resume {tmp_path}`"
    )
    learner.log_path.write_text("12:00:00 learner-0 ERROR learner rank 0 cannot write checkpoint 1: No space left\n")
    said = supervisor.final_checkpoint_refused()
    assert said is not None and said.startswith("failed: learner rank 0 cannot write checkpoint 1: No space left")
    assert f"rlmq up --resume {tmp_path}" in said
    learner.process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(0)"])
    learner.process.wait()
    assert supervisor.final_checkpoint_refused() is None
