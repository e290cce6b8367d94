"""The wheel holds every module of every rlmq package (an unlisted subpackage would still import in
an editable install, and only break for users), and `common/` imports nothing from the services."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

PACKAGES = ("common", "actors", "learners", "coordinator", "cli")


def test_wheel_contains_every_module(tmp_path: Path, repo_root: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(repo_root),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("rlmq-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in PACKAGES:
        for source in (repo_root / package).rglob("*.py"):
            inside = f"rlmq/{package}/{source.relative_to(repo_root / package).as_posix()}"
            assert inside in names, f"{inside} is missing from the wheel: list its package in pyproject"
        assert f"rlmq/{package}/py.typed" in names


@pytest.mark.parametrize(
    "path", sorted(Path(__file__).resolve().parent.parent.joinpath("common").glob("*.py")), ids=lambda p: p.name
)
def test_common_is_a_leaf(path: Path) -> None:
    services = tuple(f"rlmq.{p}" for p in PACKAGES[1:])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            assert not name.startswith(services), f"{path.name} imports {name}: common/ must stay a leaf"
