"""The chart's `kafka` values: the settings' kafka section, its Secrets mounted as files, the
MSK IAM choice with IRSA, and nothing secret in the rendered manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_helm_chart import HelmError, helm, only, render

from reclaimd.kafkaconn import KafkaSettings

__all__ = ["helm"]  # its fixture: a clear failure when helm is not built

DIR = "/etc/reclaimd/kafka"


def _pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = only(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def _kafka_section(docs: list[dict[str, Any]]) -> dict[str, Any]:
    config = yaml.safe_load(only(docs, "ConfigMap")["data"]["config.yaml"])
    section: dict[str, Any] = config.get("kafka", {})
    return section


def test_plaintext_by_default_mounts_nothing(tmp_path: Path) -> None:
    docs = render(tmp_path)
    assert _kafka_section(docs) == {}
    assert not [v for v in _pod(docs)["volumes"] if v["name"].startswith("kafka-")]


def test_scram_over_tls_reads_the_password_and_ca_from_the_named_secrets(tmp_path: Path) -> None:
    values = {
        "kafka": {
            "securityProtocol": "SASL_SSL",
            "tls": {"caSecret": {"name": "kafka-ca", "key": "ca.crt"}},
            "sasl": {
                "mechanism": "SCRAM-SHA-512",
                "username": "reclaimd",
                "passwordSecret": {"name": "reclaimd-kafka-user", "key": "password"},
            },
        },
        "config": {"ledger": {"bootstrap": "b-1.msk:9096"}},
    }
    docs = render(tmp_path, values)
    section = _kafka_section(docs)
    assert section == {
        "security_protocol": "SASL_SSL",
        "tls": {"ca_file": f"{DIR}/ca/ca.crt", "check_hostname": True},
        "sasl": {
            "mechanism": "SCRAM-SHA-512",
            "username": "reclaimd",
            "password_file": f"{DIR}/sasl/password",
        },
    }
    pod = _pod(docs)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kafka-ca"]["secret"]["secretName"] == "kafka-ca"
    assert volumes["kafka-sasl"]["secret"] == {
        "secretName": "reclaimd-kafka-user",
        "defaultMode": 0o440,
        "items": [{"key": "password", "path": "password"}],
    }
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["kafka-sasl"] == {
        "name": "kafka-sasl",
        "mountPath": f"{DIR}/sasl",
        "readOnly": True,
    }
    assert mounts["kafka-ca"]["mountPath"] == f"{DIR}/ca"
    # The section is reclaimd's own settings, once the files are there.
    (tmp_path / "ca.crt").write_text("")
    (tmp_path / "password").write_text("x")
    local = yaml.safe_dump(section).replace(f"{DIR}/ca", str(tmp_path)).replace(
        f"{DIR}/sasl", str(tmp_path)
    )
    assert KafkaSettings.model_validate(yaml.safe_load(local)).describe().startswith("SASL_SSL")


def test_mtls_with_a_strimzi_user_secret(tmp_path: Path) -> None:
    values = {
        "kafka": {
            "securityProtocol": "SSL",
            "tls": {
                "caSecret": {"name": "my-cluster-cluster-ca-cert", "key": "ca.crt"},
                "clientSecret": {"name": "reclaimd", "certKey": "user.crt", "keyKey": "user.key"},
            },
        }
    }
    docs = render(tmp_path, values)
    assert _kafka_section(docs)["tls"] == {
        "ca_file": f"{DIR}/ca/ca.crt",
        "cert_file": f"{DIR}/client/user.crt",
        "key_file": f"{DIR}/client/user.key",
        "check_hostname": True,
    }
    assert "sasl" not in _kafka_section(docs)
    names = [v["name"] for v in _pod(docs)["volumes"]]
    assert "kafka-client" in names and "kafka-sasl" not in names


def test_msk_iam_uses_the_irsa_role_and_mounts_no_password(tmp_path: Path) -> None:
    arn = "arn:aws:iam::123456789012:role/reclaimd"
    values = {
        "serviceAccount": {"awsRoleArn": arn},
        "kafka": {
            "securityProtocol": "SASL_SSL",
            "sasl": {"mechanism": "OAUTHBEARER", "mskIamRegion": "eu-west-1"},
        },
    }
    docs = render(tmp_path, values)
    assert _kafka_section(docs) == {
        "security_protocol": "SASL_SSL",
        "tls": {"check_hostname": True},
        "sasl": {"mechanism": "OAUTHBEARER", "msk_iam_region": "eu-west-1"},
    }
    assert only(docs, "ServiceAccount")["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": arn
    }
    assert not [v for v in _pod(docs)["volumes"] if v["name"].startswith("kafka-")]


@pytest.mark.parametrize(
    ("kafka", "says"),
    [
        (
            {"securityProtocol": "SASL_SSL", "sasl": {"mechanism": "SCRAM-SHA-512"}},
            "kafka.sasl: SCRAM-SHA-512 needs username and passwordSecret.name",
        ),
        (
            {"securityProtocol": "SASL_SSL", "sasl": {"mechanism": "OAUTHBEARER"}},
            "kafka.sasl.mskIamRegion: required with OAUTHBEARER",
        ),
        ({"securityProtocol": "TLS"}, "securityProtocol"),
    ],
)
def test_an_incomplete_kafka_value_fails_the_install(
    tmp_path: Path, kafka: dict[str, Any], says: str
) -> None:
    with pytest.raises(HelmError) as e:
        render(tmp_path, {"kafka": kafka})
    assert says in str(e.value)
