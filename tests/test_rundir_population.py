"""`rlmq status` and the run directory of a population run, from a real Redis filled as the
coordinator fills it (no processes: the store is written directly)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import torch

from rlmq.cli import figures, rundir
from rlmq.cli.status import show_status
from rlmq.common import wire
from rlmq.common.algorithms import ALGORITHMS, PPOConfig
from rlmq.common.config import HyperRange, PBTConfig, RunConfig
from rlmq.common.schema import EnvSpec
from rlmq.coordinator.records import LoggedDecision, MemberRecord, ProgressSample
from rlmq.coordinator.store import RunStore
from rlmq.learners.networks import ActorCritic

TUNABLE = ALGORITHMS["ppo"].tunable

SPEC = EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=2)
BASE = {name: float(getattr(PPOConfig(), name)) for name in TUNABLE}
T0 = 1_700_000_000.0  # progress samples every second from here; decisions fall between them
# A member's row in the population table: marker, member, generation, parent, env steps, fitness,
# mean of the last 100, hyperparameters.
MEMBER_ROW = re.compile(r"^  ([* ]) +(\d+) +(\d+) +(-|\d+) +([\d,]+) +(\S+) +(\S+)  (.*)$", re.MULTILINE)


def hyperparams(lr: float, ent: float) -> dict[str, float]:
    return {**BASE, "learning_rate": lr, "ent_coef": ent}


def member_params(member: int) -> dict[str, Any]:
    torch.manual_seed(member)  # each member's weights differ, so a mixed-up member shows
    net = ActorCritic(SPEC, (8, 8))
    return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}


@pytest.fixture
def store(redis_client: redis.Redis, run_id: str) -> RunStore:
    return RunStore(redis_client, run_id)


@pytest.fixture
def population_run(store: RunStore) -> dict[str, Any]:
    """Three members; member 1 is the best; member 2 copied member 1 (decision 1), member 0
    explored (decision 2)."""
    ranges = {"learning_rate": HyperRange(5e-4, 5e-3, log=True), "ent_coef": HyperRange(0.0, 0.01)}
    run_config = RunConfig(population=3, target_return=475.0, pbt=PBTConfig(ranges=ranges))
    store.save_config(run_config, SPEC)
    records = {
        0: MemberRecord(hyperparams(3.0e-3, 0.004)),
        1: MemberRecord(hyperparams(1.2e-3, 0.002)),
        2: MemberRecord(hyperparams(4.5e-3, 0.009)),
    }
    store.put_members(records)
    for member, steps in {0: 41_000, 1: 43_000, 2: 36_000}.items():
        store.add_actor_report(f"actor-{member}", member, steps, [])
    store.add_actor_report("actor-0", 0, 0, [100.0 + i for i in range(30)])
    # newest first 479 … 450: fitness (last 20) 469.5, mean of all 464.5
    store.add_actor_report("actor-1", 1, 0, [450.0 + i for i in range(30)])
    store.add_actor_report("actor-2", 2, 0, [10.0] * 40)  # dropped by the copy below
    decisions = [
        LoggedDecision(
            id=1,
            time=T0 + 3.5,
            target=2,
            source=1,
            kind="exploit",
            hyperparams=hyperparams(1.5e-3, 0.002),
            previous=records[2].hyperparams,
            generation=1,
            env_steps=20_000,
            run_env_steps=35_000,
            fitness={"2": 10.0, "1": 460.0},
        ),
        LoggedDecision(
            id=2,
            time=T0 + 6.0,
            target=0,
            source=0,
            kind="explore",
            hyperparams=hyperparams(3.0e-3, 0.005),
            previous=records[0].hyperparams,
            generation=1,
            env_steps=21_000,
            run_env_steps=60_000,
            fitness={"0": 115.0},
        ),
    ]
    for entry in decisions:
        assert store.append_decision(entry)
        record = MemberRecord(entry.hyperparams, entry.generation, entry.source, entry.env_steps)
        store.apply_decision(entry.id, entry.target, record, copied=entry.source != entry.target)
        records[entry.target] = record
    store.add_actor_report("actor-2", 2, 0, [300.0, 320.0, 340.0])  # since the copy: too few for a fitness
    for second in range(11):
        members = {
            "0": 100.0 + second,
            "1": 400.0 + 5 * second,
            "2": None if 4 <= second <= 5 else 50.0 + 20 * second,
        }
        store.append_progress(
            ProgressSample(T0 + second, 10_000 * second, 10 * second, members["1"], 10_000.0, 0.5, members)
        )
    store.set_status(
        state="running",
        env_steps=120_000,
        mean_return=464.5,
        best_member=1,
        pbt_decisions=2,
        policy_version=12,
        updated_at=time.time(),
    )
    params = {m: member_params(m) for m in range(3)}
    for member in range(3):
        weights = wire.Weights(member=member, version=10 + member, params=params[member])
        store.put_encoded_weights(member, wire.encode(weights))
    return {"run_config": run_config, "records": records, "decisions": decisions, "params": params}


def test_status_lists_every_member_marks_the_best_and_shows_the_decisions(
    store: RunStore,
    population_run: dict[str, Any],
    redis_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert show_status(tmp_path, redis_url, store.run) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 100 for line in out.splitlines()), out
    rows = {int(m[2]): m.groups() for m in MEMBER_ROW.finditer(out)}
    assert sorted(rows) == [0, 1, 2], out
    assert [member for member, row in rows.items() if row[0] == "*"] == [1]
    # marker, member, generation, parent, env steps, fitness (last 20), mean of last 100, hyperparams
    assert rows[1] == ("*", "1", "0", "-", "43,000", "469.5", "464.5", "lr 1.2e-03  ent 0.002")
    assert rows[2] == (" ", "2", "1", "1", "36,000", "—", "320.0", "lr 1.5e-03  ent 0.002")
    assert rows[0] == (" ", "0", "1", "0", "41,000", "119.5", "114.5", "lr 3.0e-03  ent 0.005")
    assert "PBT decisions: 2 applied; the last 2:" in out
    exploit = next(line for line in out.splitlines() if "member 2 ← member 1" in line)
    assert exploit.split()[:2] == ["1", "exploit"] and "20,000" in exploit
    assert "lr 4.5e-03 → 1.5e-03" in exploit and "ent 0.009 → 0.002" in exploit
    explore = next(line for line in out.splitlines() if "member 0 ← member 0" in line)
    assert explore.split()[:2] == ["2", "explore"] and "21,000" in explore
    assert "ent 0.004 → 0.005" in explore and "lr" not in explore  # lr did not change


def test_status_of_a_single_agent_has_no_population_table(
    store: RunStore, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store.save_config(RunConfig(), SPEC)
    store.put_members({0: MemberRecord(BASE)})
    store.add_actor_report("actor-0", 0, 0, [20.0, 30.0])
    store.set_status(
        state="running", env_steps=5_000, mean_return=25.0, best_member=0, pbt_decisions=0, updated_at=time.time()
    )
    assert show_status(tmp_path, redis_url, store.run) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5, lines  # run, config, steps, policy, updated: as before populations
    assert "mean return (last 100) 25.0" in lines[2]
    assert not any("population" in line or "PBT" in line or "member" in line for line in lines)


def test_results_of_a_population_run(store: RunStore, population_run: dict[str, Any], tmp_path: Path) -> None:
    run_config, params = population_run["run_config"], population_run["params"]
    summary = rundir.write_results(tmp_path, store, SPEC, run_config, launched=T0 - 5, outcome="stopped")

    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["best_member"] == 1 and state["version"] == 11
    assert sorted(state["members"]) == [0, 1, 2]
    for name, value in params[1].items():
        assert torch.equal(state["params"][name], torch.from_numpy(value)), name
    for member, entry in state["members"].items():
        assert entry["version"] == 10 + member
        assert entry["hyperparams"] == population_run["records"][member].hyperparams
        for name, value in params[member].items():
            assert torch.equal(entry["params"][name], torch.from_numpy(value)), (member, name)
    assert state["members"][2]["generation"] == 1 and state["members"][2]["parent"] == 1
    assert state["env_spec"]["obs_shape"] == (4,) and state["run_config"]["population"] == 3

    for plot in ("learning_curve.png", "lineage.png"):
        data = (tmp_path / plot).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000, plot

    lineage = json.loads((tmp_path / "lineage.json").read_text())
    assert [(d["id"], d["kind"], d["target"], d["source"]) for d in lineage] == [
        (1, "exploit", 2, 1),
        (2, "explore", 0, 0),
    ]
    # as the coordinator logged them: the run's env steps when each decision was taken
    assert [d["run_env_steps"] for d in lineage] == [35_000, 60_000]
    assert lineage[0]["previous"]["learning_rate"] == 4.5e-3 and lineage[0]["hyperparams"]["learning_rate"] == 1.5e-3

    header = (tmp_path / "metrics.csv").read_text().splitlines()[0]
    assert header.startswith("time,env_steps") and header.endswith("member_0,member_1,member_2")

    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert (on_disk["best_member"], on_disk["population"], on_disk["pbt_decisions"]) == (1, 3, 2)
    assert on_disk["policy_version"] == 11
    members = {m["member"]: m for m in on_disk["members"]}
    assert sorted(members) == [0, 1, 2]
    assert members[1]["mean_return_last_100"] == pytest.approx(464.5)
    assert members[2]["mean_return_last_100"] == pytest.approx(320.0)
    assert (members[2]["generation"], members[2]["parent"], members[2]["env_steps"]) == (
        1,
        1,
        36_000,
    )
    assert members[0]["hyperparams"]["ent_coef"] == 0.005


def test_learning_curve_has_a_line_per_member_and_lineage_an_arrow_per_copy(
    store: RunStore, population_run: dict[str, Any]
) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.text import Annotation

    progress = store.progress()
    fig, ax = plt.subplots()
    figures.draw_member_curves(ax, progress, 3)
    lines = {str(line.get_label()): line for line in ax.get_lines()}
    assert sorted(lines) == ["member 0", "member 1", "member 2"]
    member_2 = np.asarray(lines["member 2"].get_ydata(), dtype=float)
    assert np.isnan(member_2).sum() == 2  # no episodes after its copy: NaN, a gap in the line
    plt.close(fig)

    decisions = store.decisions()
    fig = figures.lineage_figure(decisions, 3, 100_000, "lineage")
    arrows = [a for a in fig.axes[0].texts if isinstance(a, Annotation) and a.arrow_patch is not None]
    # one arrow, from the source's row (member 1) to the target's (member 2)
    assert [(a.xyann, a.xy) for a in arrows] == [((35_000, 1), (35_000, 2))]
    dots = [line for line in fig.axes[0].get_lines() if line.get_marker() == "o"]
    assert [(np.asarray(d.get_xdata()).tolist(), np.asarray(d.get_ydata()).tolist()) for d in dots] == [([60_000], [0])]
    plt.close(fig)


def test_results_of_a_single_agent_keep_their_shape_and_draw_no_lineage(store: RunStore, tmp_path: Path) -> None:
    run_config = RunConfig()
    store.save_config(run_config, SPEC)
    store.put_members({0: MemberRecord(BASE)})
    store.add_actor_report("actor-0", 0, 0, [20.0, 30.0])
    store.append_progress(ProgressSample(T0, 1_000, 2, 25.0, 500.0, 0.0, {"0": 25.0}))
    store.set_status(state="done", env_steps=1_000, mean_return=25.0, best_member=0)
    params = member_params(0)
    store.put_encoded_weights(0, wire.encode(wire.Weights(member=0, version=4, params=params)))
    summary = rundir.write_results(tmp_path, store, SPEC, run_config, launched=T0 - 5, outcome="done")
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert (state["version"], state["best_member"], sorted(state["members"])) == (4, 0, [0])
    assert all(torch.equal(state["params"][k], torch.from_numpy(v)) for k, v in params.items())
    assert (tmp_path / "metrics.csv").read_text().splitlines()[0] == (
        "time,env_steps,episodes,mean_return,steps_per_s,policy_lag"
    )
    assert (tmp_path / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "lineage.png").exists() and not (tmp_path / "lineage.json").exists()
    assert (summary["population"], summary["pbt_decisions"], len(summary["members"])) == (1, 0, 1)
