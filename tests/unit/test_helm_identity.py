"""The chart's `checkpointIdentity`: reclaimd's projected ServiceAccount token (audience
reclaimd.io/checkpoint) mounted in the controller and the node agent, and the settings'
checkpoint.identity_token_file pointing at it; off, neither."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_helm_chart import HelmError, helm, only, render, settings_of

from reclaimd_trainer.auth import AUDIENCE

__all__ = ["helm"]  # its fixture: a clear failure when helm is not built

DIR = "/var/run/secrets/reclaimd.io/checkpoint"


def pod(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


def test_on_by_default_in_the_controller_and_the_agent(tmp_path: Path) -> None:
    docs = render(tmp_path, {"nodeAgent": {"enabled": True}})
    for workload, cm in (("Deployment", None), ("DaemonSet", "-node-agent")):
        spec = pod(only(docs, workload))
        (volume,) = [v for v in spec["volumes"] if v["name"] == "checkpoint-identity"]
        (source,) = volume["projected"]["sources"]
        assert source["serviceAccountToken"] == {
            "audience": AUDIENCE, "expirationSeconds": 600, "path": "token",
        }  # fmt: skip
        mounts = spec["containers"][0]["volumeMounts"]
        assert {"name": "checkpoint-identity", "mountPath": DIR, "readOnly": True} in mounts
        name = f"reclaimd{cm or ''}"
        settings = settings_of(only(docs, "ConfigMap", name), tmp_path)
        assert settings.checkpoint.identity_token_file == Path(DIR) / "token"
    # the user's checkpoint settings are kept beside it
    config = yaml.safe_load(only(docs, "ConfigMap", "reclaimd")["data"]["config.yaml"])
    assert config["checkpoint"]["require_pod_ip"] is True


def test_off_mounts_nothing_and_sets_nothing(tmp_path: Path) -> None:
    docs = render(tmp_path, {"checkpointIdentity": {"enabled": False}})
    spec = pod(only(docs, "Deployment"))
    assert "checkpoint-identity" not in [v["name"] for v in spec["volumes"]]
    settings = settings_of(only(docs, "ConfigMap", "reclaimd"), tmp_path)
    assert settings.checkpoint.identity_token_file is None


def test_a_lifetime_below_the_apis_minimum_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HelmError, match="expirationSeconds"):
        render(tmp_path, {"checkpointIdentity": {"expirationSeconds": 60}})
