"""A run directory on a disk that fills (issue 41): one `error:` line naming it, exit 1, nothing
corrupted, and `rlmq up --resume` goes on once space is freed. A real 20 MB tmpfs (needs root)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.procs import start_up, wait_for, wait_until_stepping

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def fill(path: Path) -> None:
    """Write zeros to `path` until its disk has no room left."""
    block = bytes(1 << 16)
    with open(path, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(block)


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
