"""The Grafana dashboards (deploy/grafana/) against Grafana's own dashboard schema, and their wiring:
every query on the `${datasource}` variable, provisioning files Grafana can read.

The schema comes from Grafana Labs' `grafana-foundation-sdk` (pinned in pyproject), whose models are
generated from the schema Grafana itself loads dashboards with; no package ships it as JSON Schema.
What the queries say, and that they find data, is tests/test_observability.py's part.
"""

from __future__ import annotations

import enum
import json
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.cog import plugins, runtime
from grafana_foundation_sdk.models import dashboard as grafana

GRAFANA = Path(__file__).resolve().parent.parent / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a row's panels


plugins.register_default_plugins()


def grafana_errors(value: Any, hint: Any, path: str) -> list[str]:
    """Where JSON `value` departs from `hint`, a type of Grafana's dashboard schema as the foundation
    SDK declares it: unknown fields (the schema allows no others), types, enum and literal values.
    (The SDK gives every field a default, so it cannot say which fields the schema requires.)"""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any or hint is object:
        return []
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return []
        tries = [grafana_errors(value, arg, path) for arg in args if arg is not type(None)]
        return min(tries, key=len)
    if origin is typing.Literal:
        return [] if any(value == a and type(value) is type(a) for a in args) else [f"{path}: {value!r} not in {args}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: not a list"]
        return [e for i, item in enumerate(value) for e in grafana_errors(item, args[0], f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: not an object"]
        return [e for k, item in value.items() for e in grafana_errors(item, args[1], f"{path}.{k}")]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        allowed = [m.value for m in hint]
        return [] if value in allowed and not isinstance(value, bool) else [f"{path}: {value!r} not in {allowed}"]
    scalars: dict[Any, tuple[type, ...]] = {str: (str,), int: (int,), float: (int, float), bool: (bool,)}
    if hint in scalars:
        ok = isinstance(value, scalars[hint]) and (hint is bool or not isinstance(value, bool))
        return [] if ok else [f"{path}: {value!r} is not of type {hint.__name__}"]
    if isinstance(hint, type) and hasattr(hint, "from_json"):
        return model_errors(value, hint, path)
    return [f"{path}: no rule for {hint}"]


def model_errors(value: Any, model: type, path: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{path}: not an object ({model.__name__})"]
    hints = typing.get_type_hints(model)
    if model is grafana.Panel:  # as Panel.from_json does: options, field config and queries by plugin
        hints = {**hints, **plugin_hints(value)}
    errors = []
    for key, item in value.items():
        snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower()
        field = next((f for f in (snake, f"{snake}_val") if f in hints), None)  # `_val`: id, type, ...
        if field is None:
            errors.append(f"{path}.{key}: not a field of {model.__name__}")
        else:
            errors += grafana_errors(item, hints[field], f"{path}.{key}")
    return errors


def plugin_hints(panel: dict[str, Any]) -> dict[str, Any]:
    hints: dict[str, Any] = {}
    config = runtime.panelcfg_config(panel.get("type", ""))
    if config is not None and config.options_from_json_hook is not None:
        hints["options"] = config.options_from_json_hook.__self__
    query = runtime.Runtime().dataquery_variants.get((panel.get("datasource") or {}).get("type", ""))
    if query is not None:
        hints["targets"] = list[query.from_json_hook.__self__]
    custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom")
    if custom is not None and config is not None and config.field_config_from_json_hook is not None:
        errors = grafana_errors(custom, config.field_config_from_json_hook.__self__, "fieldConfig.defaults.custom")
        assert not errors, errors
    return hints


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_matches_grafanas_schema(path: Path) -> None:
    board = json.loads(path.read_text())
    assert not grafana_errors(board, grafana.Dashboard, path.name)
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 41
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in panels(board))


def test_the_schema_check_catches_mistakes() -> None:
    board = json.loads(DASHBOARDS[0].read_text())
    board["panels"][0]["gridPos"]["w"] = "wide"
    board["panels"][0]["options"]["graphMode"] = "sparkles"
    board["templating"]["list"][0]["colour"] = "red"
    board["panels"][0]["targets"][0]["exprr"] = "up"
    errors = grafana_errors(board, grafana.Dashboard, "board")
    assert len(errors) == 4 and all("board." in e for e in errors), errors


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_reads_the_datasource_variable(path: Path) -> None:
    board = json.loads(path.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    refs = [p["datasource"] for p in panels(board) if p["type"] != "row"]
    refs += [t["datasource"] for p in panels(board) for t in p.get("targets", [])]
    refs += [v["datasource"] for v in variables.values() if v["type"] == "query"]
    assert refs and all(ref == DATASOURCE for ref in refs), "a query not on ${datasource}"


def test_grafana_provisioning_files() -> None:
    datasources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "rlmq.yaml").read_text())
    assert [d["type"] for d in datasources["datasources"]] == ["prometheus"]
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "rlmq.yaml").read_text())
    assert providers["apiVersion"] == 1 and providers["providers"][0]["type"] == "file"
    assert providers["providers"][0]["options"]["path"]
