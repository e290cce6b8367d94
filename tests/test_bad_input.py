"""Bad input ends in exit 2 and one line that names the problem and the fix: never a traceback,
never a run that starts and then waits forever.

Each case runs the real `rlmq` command as a subprocess. They all fail at start-up, before any
service process is spawned, so each takes well under a second; the timeout turns a hang into a
failure.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rlmq.cli.upconfig import probe_run_dir
from rlmq.common.algorithms import DQNConfig, SACConfig
from rlmq.common.config import HyperRange, PBTConfig, RunConfig
from rlmq.common.loading import from_mapping, to_json
from rlmq.common.transport import free_port

HANG = 60  # seconds: these commands fail at start-up; one still running this long is the bug


def rlmq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlmq.cli", *args],
        capture_output=True,
        text=True,
        timeout=HANG,
        env={**os.environ, **(env or {})},
    )


def the_one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single `error:` line of a command that refused its input with exit 2."""
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert result.returncode == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    return lines[0]


def up(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    return the_one_line(rlmq("up", "--run-dir", str(tmp_path / "run"), *args, env=env))


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- non-finite numbers: a run that every process would refuse to be assigned to ---------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_non_finite_target_return_is_refused_before_the_run_starts(tmp_path: Path, value: str) -> None:
    line = up(tmp_path, "--target-return", value)
    assert f"target_return = {value} is not a finite number" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("nested.toml", "[ppo]\nlearning_rate = nan\n", "ppo.learning_rate = nan is not a finite number"),
        (
            "range.toml",
            "[pbt.ranges.learning_rate]\nlow = 1e-4\nhigh = inf\n",
            "pbt.ranges.learning_rate.high = inf is not a finite number",
        ),
        ("target.json", '{"target_return": NaN}', "target_return = nan is not a finite number"),
    ],
)
def test_a_non_finite_number_in_a_config_file_is_refused(tmp_path: Path, name: str, text: str, words: str) -> None:
    assert words in up(tmp_path, "--config", str(write(tmp_path / name, text)))


# --- an env module that cannot be imported or built ----------------------------------------------

BROKEN_MODULES = {
    "SyntaxError": "def broken(:\n",
    "ModuleNotFoundError": "import rlmq_no_such_dependency\n",
    "RuntimeError": "raise RuntimeError('the simulator licence has expired')\n",
    "ValueError": (
        "import gymnasium as gym\n\n"
        "class E(gym.Env):\n"
        "    def __init__(self):\n"
        "        raise ValueError('no map\\nloaded')\n"
    ),
}


@pytest.mark.parametrize("error", BROKEN_MODULES)
def test_an_env_module_that_raises_is_one_line_naming_the_module_and_the_error(tmp_path: Path, error: str) -> None:
    module = f"broken_env_{error.lower()}"
    write(tmp_path / f"{module}.py", BROKEN_MODULES[error])
    line = up(tmp_path, "--env", f"{module}:E", env={"PYTHONPATH": str(tmp_path)})
    assert module in line and f"{error}: " in line and "Fix the " in line


def test_an_env_module_without_the_named_class_says_so(tmp_path: Path) -> None:
    write(tmp_path / "empty_env_module.py", "X = 1\n")
    line = up(tmp_path, "--env", "empty_env_module:Missing", env={"PYTHONPATH": str(tmp_path)})
    assert "empty_env_module has no gymnasium.Env or VectorEnv class named 'Missing'" in line


def test_the_coordinator_exits_2_without_a_traceback_when_the_env_module_raises(
    tmp_path: Path, redis_url: str, run_id: str
) -> None:
    write(tmp_path / "raising_env.py", "raise RuntimeError('no display')\n")
    config = write(tmp_path / "run.json", json.dumps({"env_id": "raising_env:E"}))
    result = rlmq(
        "coordinator",
        "--run",
        run_id,
        "--redis-url",
        redis_url,
        "--run-config",
        str(config),
        "--control-bind",
        f"tcp://127.0.0.1:{free_port()}",
        "--metrics-port",
        "-1",
        "--broadcast-bind",
        f"tcp://127.0.0.1:{free_port()}",
        env={"PYTHONPATH": str(tmp_path)},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output, output
    assert "cannot import raising_env" in output and "RuntimeError: no display" in output


# --- config values of the wrong type -------------------------------------------------------------

WRONG_TYPES = [
    ('num_envs = "eight"\n', "num_envs: expected int, got 'eight'"),
    ("hidden_sizes = 64\n", "hidden_sizes: expected a list of int, got 64"),
    ("ppo = 3\n", "ppo: expected a table of PPOConfig fields, got 3"),
    ("[ppo]\nepochs = 2.5\n", "ppo.epochs: expected int, got 2.5"),
    ('target_return = "high"\n', "target_return: expected float or null, got 'high'"),
]


@pytest.mark.parametrize("command", ["up", "coordinator"])
@pytest.mark.parametrize("text, words", WRONG_TYPES)
def test_a_config_value_of_the_wrong_type_names_the_field(tmp_path: Path, command: str, text: str, words: str) -> None:
    config = str(write(tmp_path / "run.toml", text))
    if command == "up":
        line = up(tmp_path, "--config", config)
    else:  # what a container runs: the run config file alone
        line = the_one_line(rlmq("coordinator", "--run-config", config, "--redis-url", "redis://127.0.0.1:1/0"))
    assert words in line


# --- a Redis URL that is no URL ------------------------------------------------------------------

REDIS_COMMANDS = {
    "up": ["up", "--run-dir", "{tmp}/run"],
    "coordinator": ["coordinator"],
    "status": ["status", "--run", "r"],
    "check": ["check", "--metrics-port", "9"],
}


@pytest.mark.parametrize("url", ["localhost:6379", "foo", "redis://localhost:port/0"])
@pytest.mark.parametrize("command", REDIS_COMMANDS)
def test_a_redis_url_that_is_not_a_url_names_the_form_to_use(tmp_path: Path, command: str, url: str) -> None:
    args = [arg.format(tmp=tmp_path) for arg in REDIS_COMMANDS[command]]
    line = the_one_line(rlmq(*args, "--redis-url", url))
    assert f"--redis-url {url} is not a Redis URL" in line and "use redis://HOST:PORT/DB" in line


# --- a run directory that cannot be made ---------------------------------------------------------


def test_status_of_a_run_whose_password_file_is_gone_says_so_in_one_line(tmp_path: Path) -> None:
    """`rlmq up` names its private Redis's password file in run.json; where that file cannot be
    read (moved, or named relative to another directory by an older `rlmq up`), `rlmq status`
    says which and what to pass instead."""
    info = {"redis_url": "redis://127.0.0.1:1/0", "redis_password_file": "elsewhere/redis/password", "run": "r"}
    write(tmp_path / "run.json", json.dumps(info))
    line = the_one_line(rlmq("status", "--run-dir", str(tmp_path)))
    assert "run.json" in line and "elsewhere/redis/password" in line and "--redis-password-file" in line


def test_status_given_two_run_directories_says_to_give_one(tmp_path: Path) -> None:
    line = the_one_line(rlmq("status", str(tmp_path / "a"), "--run-dir", str(tmp_path / "b")))
    assert f"two run directories, {tmp_path / 'a'} and --run-dir {tmp_path / 'b'}" in line
    assert "rlmq status RUN_DIR" in line


def test_a_run_dir_under_proc_is_refused(tmp_path: Path) -> None:
    line = the_one_line(rlmq("up", "--run-dir", "/proc/rlmq-run"))
    assert "cannot use /proc/rlmq-run as the run directory" in line and "pass a --run-dir" in line


def test_a_run_dir_under_a_regular_file_is_refused(tmp_path: Path) -> None:
    run_dir = write(tmp_path / "notes.txt", "") / "run"
    line = the_one_line(rlmq("up", "--run-dir", str(run_dir)))
    assert f"cannot use {run_dir} as the run directory (Not a directory)" in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_run_dir_in_a_read_only_directory_is_refused(tmp_path: Path) -> None:
    parent = tmp_path / "read-only"
    parent.mkdir(mode=0o555)
    line = the_one_line(rlmq("up", "--run-dir", str(parent / "run")))
    assert "(Permission denied)" in line


def test_probing_a_run_dir_leaves_no_directory_behind(tmp_path: Path) -> None:
    probe_run_dir(tmp_path / "runs" / "a")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    probe_run_dir(tmp_path / "kept")
    assert (tmp_path / "kept").is_dir()


# --- neighbours: other start-up mistakes, each one line --------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (["--population", "0"], "population must be in [1, 256]"),
        (["--algo", "a2c"], "algo 'a2c' is not one of"),
        (["--env", "NoSuchEnv-v0"], "unknown env 'NoSuchEnv-v0'"),
        (["--seed", str(2**70)], f"seed: {2**70} does not fit in 64 bits"),
        (["--config", "/nonexistent/run.toml"], "No such file or directory"),
    ],
)
def test_other_bad_flags_are_one_line(tmp_path: Path, args: list[str], words: str) -> None:
    assert words in up(tmp_path, *args)


@pytest.mark.parametrize("flag, value", [("--actors", "-1"), ("--learners", "0"), ("--torch-threads", "0")])
def test_a_flag_below_its_minimum_is_refused_by_the_parser(tmp_path: Path, flag: str, value: str) -> None:
    """Typer's own box, not one line, but exit 2 and nothing started (a learner with 0 threads
    would have failed the run with exit 1)."""
    result = rlmq("up", "--run-dir", str(tmp_path / "run"), flag, value)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"Invalid value for '{flag}'" in result.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("syntax.toml", "num_envs = \n", "not valid TOML: "),
        ("list.json", "[1, 2]", "expected a table of RunConfig fields at the top, got a list"),
        (
            "flat.toml",
            "learning_rate = 1e-3\n",
            "RunConfig has no field learning_rate (fields of that name: ppo.learning_rate,",
        ),
    ],
)
def test_a_config_file_rlmq_cannot_read_is_one_line(tmp_path: Path, name: str, text: str, words: str) -> None:
    assert words in up(tmp_path, "--config", str(write(tmp_path / name, text)))


# --- the type checks of from_mapping, directly ---------------------------------------------------


@pytest.mark.parametrize(
    "data, message",
    [
        ({"num_envs": True}, "num_envs: expected int, got True"),
        ({"seed": 2**63}, "does not fit in 64 bits"),
        ({"algo": 1}, "algo: expected str, got 1"),
        ({"hidden_sizes": [64, "64"]}, "hidden_sizes[1]: expected int, got '64'"),
        ({"ppo": {"nope": 1}}, "ppo: PPOConfig has no field nope"),
        ({"sac": {"target_entropy": "auto"}}, "sac.target_entropy: expected float or null, got 'auto'"),
        ({"pbt": {"elitism": 1}}, "pbt.elitism: expected bool, got 1"),
        ({"pbt": {"perturb_factors": 0.8}}, "pbt.perturb_factors: expected a list of float, got 0.8"),
        ({"pbt": {"ranges": []}}, "pbt.ranges: expected a table of HyperRange, got []"),
        (
            {"pbt": {"ranges": {"learning_rate": 1e-3}}},
            "pbt.ranges.learning_rate: expected a table of HyperRange fields, got 0.001",
        ),
        ({"pbt": {"ranges": {"learning_rate": {"low": 1e-4}}}}, "pbt.ranges.learning_rate: HyperRange needs high"),
        (
            {"pbt": {"ranges": {"learning_rate": {"low": "1e-4", "high": 1e-3}}}},
            "pbt.ranges.learning_rate.low: expected float, got '1e-4'",
        ),
        ({"target_return": 10**400}, "target_return: "),
    ],
)
def test_from_mapping_names_the_field_a_value_of_the_wrong_type_is_in(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        from_mapping(RunConfig, data)
    assert message in str(caught.value)


def test_from_mapping_takes_an_int_for_a_float_field_and_stores_a_float() -> None:
    config = from_mapping(RunConfig, {"target_return": 475, "ppo": {"gamma": 1}, "pbt": {"perturb_factors": [1, 2]}})
    assert type(config.target_return) is float and type(config.ppo.gamma) is float
    assert config.pbt.perturb_factors == (1.0, 2.0) and all(type(f) is float for f in config.pbt.perturb_factors)


def test_from_mapping_takes_null_for_an_optional_field() -> None:
    assert from_mapping(RunConfig, {"target_return": None, "dqn": {"max_grad_norm": None}}).dqn.max_grad_norm is None


def test_a_shared_replay_of_n_step_returns_refuses_a_ranged_gamma() -> None:
    shared = DQNConfig(share_replay=True, n_step=3)
    ranged = PBTConfig(ranges={"gamma": HyperRange(0.9, 0.999)})
    with pytest.raises(ValueError, match="dqn.share_replay with n_step > 1 needs one γ: take gamma out of pbt.ranges"):
        RunConfig(algo="dqn", dqn=shared, population=4, pbt=ranged)
    RunConfig(algo="dqn", dqn=replace(shared, n_step=1), population=4, pbt=ranged)  # 1-step returns carry no γ
    RunConfig(algo="dqn", dqn=shared, population=4)  # γ the same for every member


@pytest.mark.parametrize(
    "config",
    [
        RunConfig(),
        RunConfig(algo="sac", env_id="Pendulum-v1", target_return=-200.0, sac=SACConfig(target_entropy=-1.0)),
        RunConfig(
            algo="dqn",
            dqn=DQNConfig(max_grad_norm=None),
            population=4,
            pbt=PBTConfig(ranges={"learning_rate": HyperRange(1e-4, 1e-2, log=True)}),
        ),
    ],
)
def test_a_config_written_as_json_reads_back_equal(config: RunConfig) -> None:
    """What `rlmq up` writes to config.json and the coordinator stores in Redis passes the checks."""
    assert from_mapping(RunConfig, json.loads(to_json(config))) == config


@pytest.mark.parametrize(
    "build, name",
    [
        (lambda: RunConfig(batch_wait_s=math.inf), "batch_wait_s = inf"),
        (lambda: SACConfig(tau=math.nan), "sac.tau = nan"),
        (lambda: DQNConfig(max_grad_norm=-math.inf), "dqn.max_grad_norm = -inf"),
        (lambda: PBTConfig(perturb_factors=(0.8, math.inf)), "pbt.perturb_factors[1] = inf"),
    ],
)
def test_every_config_refuses_a_non_finite_float_by_its_path(build: Any, name: str) -> None:
    with pytest.raises(ValueError, match="is not a finite number") as caught:
        build()
    assert name in str(caught.value)


# --- flags that name what this machine does not have -------------------------------------------


def test_a_gpu_asked_for_on_a_machine_without_one_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    line = up(tmp_path, "--device", "cuda")  # the actors' device: test_atari.py
    assert "--device cuda: torch sees no GPU on this machine; use --device auto or cpu" in line
    assert not (tmp_path / "run").exists()


def test_a_bind_host_that_is_not_this_machines_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    line = up(tmp_path, "--bind-host", "192.0.2.7")  # TEST-NET-1: never a local address
    assert "--bind-host 192.0.2.7 is not an address of this machine" in line
    assert not (tmp_path / "run").exists()
