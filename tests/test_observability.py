"""Observability: the metrics rlmq defines, each process's /metrics, a real Prometheus scraping
`rlmq up`, and the dashboards' queries (they parse, and name only what a running rlmq exports).
The dashboards' JSON against Grafana's schema is tests/test_dashboards.py's part.

promtool and prometheus come from Debian's `prometheus` package (scripts/install installs it when
it runs as root); without them these tests fail and say so.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram

from rlmq.common.metrics import (
    ActorMetrics,
    BatchHistogram,
    CoordinatorMetrics,
    Heartbeat,
    LearnerMetrics,
)
from rlmq.common.transport import free_port

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
# Dashboard variables, as Grafana would fill them in for a query.
VARIABLES = {"__rate_interval": "15s", "__interval": "5s", "__range": "5m", "run": ".*", "hyperparameter": ".*"}
# A short PBT run: two members, decisions every few thousand env steps.
RUN_CONFIG = """
env_id = "CartPole-v1"
population = 2
total_steps = 1_000_000_000
seed = 1

[pbt]
interval = 4_000
fraction = 0.5
fitness_episodes = 5
"""


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} not found: these tests need Debian's prometheus package (promtool, "
            "prometheus). scripts/install installs it as root; else: sudo apt-get install prometheus"
        )
    return path


def wait_for(check: Callable[[], Any], timeout: float, what: str, period: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except (OSError, ValueError):
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(period)


def scrape(target: str) -> str:
    return urllib.request.urlopen(f"http://{target}/metrics", timeout=10).read().decode()


def sample(text: str, name: str) -> float:
    """The value of an unlabelled sample in exposition text (0 if absent)."""
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match[1]) if match else 0.0


def exported_names(text: str) -> set[str]:
    """Sample names a scrape carries, and the counters and gauges it declares: a labelled metric
    none of whose children exists yet (no message rejected so far) is only declared. (A histogram
    with negative buckets has no `_sum`, so histogram names come from samples only.)"""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            if kind in ("counter", "gauge"):
                names.add(name)  # prometheus_client already names counters `..._total` here
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


# --- the dashboards' queries ----------------------------------------------------------------------


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a row's panels


def dashboard_queries() -> list[tuple[str, str, bool]]:
    """(where, expression, is a panel query) for every query of every dashboard: panel targets,
    and the metric each `label_values(metric, label)` variable reads."""
    queries = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for panel in panels(board):
            for target in panel.get("targets", []):
                queries.append((f"{path.name} / {panel['title']} / {target['refId']}", target["expr"], True))
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                match = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["query"])
                assert match, f"{path.name}: variable {variable['name']}: {variable['query']}"
                queries.append((f"{path.name} / variable {variable['name']}", match[1], False))
    assert len(queries) > 20
    return queries


def substitute(expr: str) -> str:
    """The PromQL Grafana sends: dashboard variables filled in."""
    for name in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", VARIABLES[name]).replace("$" + name, VARIABLES[name])
    assert "$" not in expr, f"an unknown variable in {expr}"
    return expr


def metric_names(expr: str) -> set[str]:
    """Every metric an expression selects: all rlmq metrics start `rlmq_`, and no other name may
    stand before a label matcher."""
    selected = set(re.findall(r"([a-zA-Z_:][\w:]*)\s*\{", expr))
    assert all(name.startswith("rlmq_") for name in selected), f"{expr} selects {selected}"
    return selected | set(re.findall(r"\b(rlmq_\w+)", expr))


def test_every_dashboard_query_parses() -> None:
    promtool = tool("promtool")
    rules = {
        "groups": [
            {
                "name": "dashboards",
                "rules": [
                    {"record": f"rlmq:dashboard_query:{i}", "expr": substitute(expr)}
                    for i, (_, expr, _) in enumerate(dashboard_queries())
                ],
            }
        ]
    }
    check = subprocess.run(
        [promtool, "check", "rules", "/dev/stdin"], input=json.dumps(rules), capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_every_panel_query_filters_by_run() -> None:
    for where, expr, is_panel in dashboard_queries():
        if is_panel:
            for name in re.findall(r"\b(rlmq_\w+)", expr):
                assert re.search(rf'{name}\{{run=~"\$run"', expr), f'{where}: {name} without {{run=~"$run"}}'


# --- the metrics themselves -----------------------------------------------------------------------


def test_every_metric_is_prefixed_and_documented_once() -> None:
    helps: dict[str, str] = {}
    for metrics in (ActorMetrics(), LearnerMetrics(), CoordinatorMetrics()):
        for family in metrics.registry.collect():
            assert family.name.startswith("rlmq_") and family.documentation, family.name
            # A name shared by roles (rejected messages, heartbeat) means the same everywhere.
            assert helps.setdefault(family.name, family.documentation) == family.documentation, family.name
        assert "rlmq_loop_heartbeat_timestamp_seconds" in {f.name for f in metrics.registry.collect()}


def test_heartbeat_writes_at_most_once_a_period() -> None:
    metrics = ActorMetrics()
    heartbeat: Heartbeat = metrics.heartbeat

    def value() -> float:
        return float(metrics.registry.get_sample_value("rlmq_loop_heartbeat_timestamp_seconds") or 0.0)

    assert value() == 0.0, "0 until the loop first runs"
    heartbeat.beat()
    first = value()
    assert abs(first - time.time()) < 5
    heartbeat.gauge.set(1.0)
    heartbeat.beat()  # within the period: not written again
    assert value() == 1.0
    heartbeat._next = 0.0  # the period is over
    heartbeat.beat()
    assert value() >= first


# --- a live `rlmq up` run and a real Prometheus ---------------------------------------------------


@dataclass
class LiveRun:
    run_dir: Path
    targets: dict[str, list[str]]  # role → host:port of each process's /metrics
    prometheus: str  # base URL of a Prometheus scraping them

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = json.loads(urllib.request.urlopen(url, timeout=10).read())
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{expr}: {exc.read().decode(errors='replace')}") from None
        assert body["status"] == "success", body
        return list(body["data"]["result"])


def start_prometheus(workdir: Path, targets_file: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A real Prometheus: the scrape config a user would write for `rlmq up` (file_sd on the run
    directory's prometheus_targets.json), scraping every second."""
    prometheus = tool("prometheus")
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "rlmq", "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}]}
        ],
    }
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    with open(workdir / "prometheus.log", "wb") as log:
        process = subprocess.Popen(
            [
                prometheus,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert process.poll() is None, (workdir / "prometheus.log").read_text()
        return bool(urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200)

    wait_for(ready, 30, "Prometheus to start")
    return process, url


def stop(process: subprocess.Popen[Any], sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    """One short `rlmq up` (2 actors, 1 learner, a population of 2 with PBT) scraped by one
    Prometheus, shared by the tests below; stopped with Ctrl-C as a user would."""
    tool("promtool")
    workdir = tmp_path_factory.mktemp("observability")
    (workdir / "run.toml").write_text(RUN_CONFIG)
    run_dir = workdir / "run"
    with open(workdir / "up.log", "wb") as log:
        up = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rlmq.cli",
                "up",
                "--run-dir",
                str(run_dir),
                "--config",
                str(workdir / "run.toml"),
                "--actors",
                "2",
                "--learners",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    prometheus = None
    try:
        targets_file = run_dir / "prometheus_targets.json"

        def targets() -> dict[str, list[str]]:
            assert up.poll() is None, (workdir / "up.log").read_text()
            return {g["labels"]["role"]: g["targets"] for g in json.loads(targets_file.read_text())}

        found = wait_for(targets, 60, "rlmq up to write prometheus_targets.json")
        prometheus, url = start_prometheus(workdir, targets_file)
        coordinator = found["coordinator"][0]
        wait_for(
            lambda: up.poll() is None and sample(scrape(coordinator), "rlmq_env_steps_total") > 0,
            90,
            "the run to take env steps",
        )
        yield LiveRun(run_dir, found, url)
    finally:
        stop(up, signal.SIGINT)
        if prometheus is not None:
            stop(prometheus)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("role", ["coordinator", "learner", "actor"])
def test_metrics_pass_promtool(live_run: LiveRun, role: str) -> None:
    promtool = tool("promtool")
    assert live_run.targets[role]
    for target in live_run.targets[role]:
        text = scrape(target)
        assert "rlmq_loop_heartbeat_timestamp_seconds" in text and "rlmq_rejected_messages_total" in text
        # every service loop beats: the latest iteration is recent
        assert time.time() - sample(text, "rlmq_loop_heartbeat_timestamp_seconds") < 30, role
        check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
        assert check.returncode == 0 and not check.stdout.strip(), f"{role} {target}: {check.stdout}{check.stderr}"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_prometheus_scrapes_the_run_through_file_sd(live_run: LiveRun) -> None:
    def env_steps_rate() -> list[dict[str, Any]]:
        result = live_run.query("sum(rate(rlmq_actor_env_steps_total[10s]))")
        return result if result and float(result[0]["value"][1]) > 0 else []

    assert wait_for(env_steps_rate, 60, "a non-empty env-steps rate from Prometheus", period=1)

    def all_up() -> list[dict[str, Any]]:  # every process `rlmq up` listed, by role, scraped
        up = live_run.query('up{job="rlmq"}')
        roles = sorted(series["metric"]["role"] for series in up)
        ok = roles == ["actor", "actor", "coordinator", "learner"] and all(s["value"][1] == "1" for s in up)
        return up if ok else []

    up = wait_for(all_up, 30, "every target up", period=1)
    assert {series["metric"]["run"] for series in up} == {
        json.loads((live_run.run_dir / "run.json").read_text())["run"]
    }


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_dashboards_use_only_metrics_rlmq_exports_and_show_data(live_run: LiveRun) -> None:
    exported = set().union(*(exported_names(scrape(t)) for ts in live_run.targets.values() for t in ts))
    queries = dashboard_queries()
    for where, expr, _ in queries:
        unknown = metric_names(expr) - exported
        assert not unknown, f"{where}: {sorted(unknown)} not exported by a running rlmq"
    # And every panel shows data from the live run (PBT decisions included), except over rejected
    # messages, which a clean run has none of, and the behavioural diversity, which only a TD3
    # population reports (tests/test_td3.py's DvD run checks it is there).
    expected = {
        substitute(expr)
        for _, expr, _ in queries
        if "rlmq_rejected_messages" not in expr and 'term="diversity"' not in expr
    }

    def empty() -> set[str]:
        return {expr for expr in expected if not live_run.query(expr)}

    left: set[str] = set(expected)
    deadline = time.monotonic() + 90
    while left and time.monotonic() < deadline:
        left = empty()
        time.sleep(1)
    assert not left, f"queries still empty: {sorted(left)}"


def test_batch_histogram_buckets_as_prometheus_does() -> None:
    """A batch of observations lands in the buckets `le` (≤) names, counted cumulatively, exactly
    as the same values observed one by one by prometheus_client's own Histogram."""
    values = np.array([-3.0, 0.0, 0.5, 10.0, 10.0, 11.0, 500.0, 1e6])
    ours_registry, theirs_registry = CollectorRegistry(), CollectorRegistry()
    ours = BatchHistogram("rlmq_x", "x", buckets=(0, 10, 500), registry=ours_registry)
    theirs = Histogram("rlmq_x", "x", buckets=(0, 10, 500), registry=theirs_registry)
    ours.observe_many(values[:3])
    ours.observe_many(values[3:])
    for value in values:
        theirs.observe(value)

    def samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
        return [
            (s.name, s.labels, s.value)
            for family in registry.collect()
            for s in family.samples
            if not s.name.endswith("_created")
        ]

    assert samples(ours_registry) == samples(theirs_registry)
    assert ("rlmq_x_bucket", {"le": "10.0"}, 5.0) in samples(ours_registry)
