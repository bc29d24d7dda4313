"""The chart's defaults fit where it runs (issue 35, item 4): `config.*` checked against the
settings model, the NetworkPolicy's Kafka egress from the bootstraps, the priority quota GKE
asks for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_helm_chart import CHART, HelmError, helm, only, render

from reclaimd.config import Settings
from reclaimd.handlers.sqs.settings import SqsSettings

__all__ = ["helm"]  # the fixture: no helm, no test

SCHEMA = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))


def model_keys(schema: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for name, sub in schema.get("properties", {}).items():
        keys.add(prefix + name)
        keys |= model_keys(sub, f"{prefix}{name}.")
    return keys


def settings_keys(model: Any, prefix: str = "") -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        keys.add(prefix + name)
        ann = field.annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            keys |= settings_keys(ann, f"{prefix}{name}.")
    return keys


def test_the_config_schema_is_the_settings_model() -> None:
    config = SCHEMA["properties"]["config"]
    assert config["additionalProperties"] is False
    schema_keys = model_keys(config)
    # Every key of the model (every section, every source's) and no other.
    assert settings_keys(Settings) <= schema_keys
    assert {k for k in schema_keys if "." not in k} == set(Settings.model_fields)
    sqs = config["properties"]["sqs"]
    assert sqs["additionalProperties"] is False
    assert set(sqs["properties"]) == set(SqsSettings.model_fields)


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"config": {"sqs": {"queue_ulr": "x"}}}, "queue_ulr"),
        ({"config": {"clustr_name": "x"}}, "clustr_name"),
        ({"config": {"policy": {"eviction": "drain-now"}}}, "/config/policy/eviction"),
        ({"config": {"sqs": {"batch_size": 11}}}, "/config/sqs/batch_size"),
    ],
)
def test_a_typo_under_config_fails_the_render(
    tmp_path: Path, values: dict[str, Any], where: str
) -> None:
    with pytest.raises(HelmError, match=where):
        render(tmp_path, values)


def test_the_chart_requires_cluster_name(tmp_path: Path) -> None:
    with pytest.raises(HelmError, match=r"config\.cluster_name is required: this cluster's name"):
        render(tmp_path, {"config": {"cluster_name": ""}})
    cm = only(render(tmp_path, {"config": {"cluster_name": "prod-eu-1"}}), "ConfigMap")
    assert "cluster_name: prod-eu-1" in cm["data"]["config.yaml"]


def kafka_rule(tmp_path: Path, values: dict[str, Any]) -> dict[str, Any] | None:
    np = only(render(tmp_path, values), "NetworkPolicy", "reclaimd")
    rules = [
        r for r in np["spec"]["egress"]
        if any("ipBlock" in t and t["ipBlock"]["cidr"] == "0.0.0.0/0" for t in r["to"]) is False
        and r["ports"][0]["port"] not in (53, 80, 988, 8080, 9465)
        and not any("podSelector" in t and "matchLabels" in t.get("podSelector", {})
                    and "k8s-app" in t["podSelector"]["matchLabels"] for t in r["to"])
    ]  # fmt: skip
    peers = [r for r in rules if not any(
        "podSelector" in t and t["podSelector"].get("matchLabels", {}).get(
            "app.kubernetes.io/name") == "reclaimd" for t in r["to"])]  # fmt: skip
    assert len(peers) <= 1, peers
    return peers[0] if peers else None


def test_no_bootstrap_no_kafka_egress(tmp_path: Path) -> None:
    assert kafka_rule(tmp_path, {}) is None


def test_kafka_egress_from_the_ledger_bootstrap(tmp_path: Path) -> None:
    # The chart README's own example: a Service kafka in namespace kafka.
    rule = kafka_rule(tmp_path, {"config": {"ledger": {"bootstrap": "kafka.kafka:9092"}}})
    assert rule == {
        "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kafka"}}}],
        "ports": [{"port": 9092, "protocol": "TCP"}],
    }


def test_kafka_egress_from_every_bootstrap(tmp_path: Path) -> None:
    boot = "10.0.0.5:9092, kafka-0.kafka-headless.streams.svc.cluster.local:9093"
    rule = kafka_rule(tmp_path, {"config": {
        "ledger": {"bootstrap": boot},
        "kafka_notices": {"enabled": True, "bootstrap": "kafka:9094"},
    }})  # fmt: skip
    assert rule is not None
    assert rule["to"] == [
        {"ipBlock": {"cidr": "10.0.0.5/32"}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "streams"}}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "reclaimd"}}},
    ]
    assert [p["port"] for p in rule["ports"]] == [9092, 9093, 9094]


def test_a_disabled_sources_bootstrap_opens_nothing(tmp_path: Path) -> None:
    values = {"config": {"kafka_notices": {"enabled": False, "bootstrap": "10.0.0.9:9092"}}}
    assert kafka_rule(tmp_path, values) is None


def test_a_broker_outside_the_cluster_needs_its_addresses(tmp_path: Path) -> None:
    msk = {"ledger": {"bootstrap": "b-1.mycluster.kafka.us-east-1.amazonaws.com:9096"}}
    with pytest.raises(HelmError, match=r"config\.ledger\.bootstrap names b-1\..*"
                       r"set networkPolicy\.kafka\.cidrs"):
        render(tmp_path, {"config": msk})
    cidrs = {"kafka": {"cidrs": ["10.0.0.0/16"]}}
    rule = kafka_rule(tmp_path, {"config": msk, "networkPolicy": cidrs})
    assert rule == {"to": [{"ipBlock": {"cidr": "10.0.0.0/16"}}],
                    "ports": [{"port": 9096, "protocol": "TCP"}]}  # fmt: skip
    # Policies off: nothing to derive, nothing refused.
    render(tmp_path, {"config": msk, "networkPolicy": {"enabled": False}})


def test_a_bootstrap_that_is_not_host_port_fails(tmp_path: Path) -> None:
    with pytest.raises(HelmError, match=r'config\.ledger\.bootstrap: "kafka" is not host:port'):
        render(tmp_path, {"config": {"ledger": {"bootstrap": "kafka"}}})


def test_the_priority_quota_covers_the_classes_used(tmp_path: Path) -> None:
    quota = only(render(tmp_path), "ResourceQuota")
    assert quota["metadata"]["namespace"] == "reclaimd"
    assert quota["spec"]["scopeSelector"]["matchExpressions"] == [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["system-cluster-critical"]}
    ]
    quota = only(render(tmp_path, {"nodeAgent": {"enabled": True}}), "ResourceQuota")
    assert quota["spec"]["scopeSelector"]["matchExpressions"][0]["values"] == [
        "system-cluster-critical", "system-node-critical",
    ]  # fmt: skip
    assert quota["spec"]["hard"] == {"pods": "10k"}
    own = {"controller": {"priorityClassName": "reclaimd-high"}}
    assert not [d for d in render(tmp_path, own) if d["kind"] == "ResourceQuota"]
    off = {"priorityQuota": {"create": False}}
    assert not [d for d in render(tmp_path, off) if d["kind"] == "ResourceQuota"]
