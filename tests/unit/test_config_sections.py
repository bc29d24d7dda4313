"""The config sections that reach the cache, the watch, the claims, the checkpoint requests,
the ledger writer and the intake: defaults, overrides, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from reclaimd import config
from reclaimd.annotations import UrlPolicy


def load(tmp_path: Path, data: object, env: dict[str, str] | None = None) -> config.Settings:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return config.load(path, env=env or {})


def test_the_checkpoint_guard_is_on_by_default() -> None:
    policy = config.load(None, env={}).checkpoint.url_policy()
    assert policy == UrlPolicy(require_pod_ip=True)


def test_an_allowlist_from_the_file_and_the_environment(tmp_path: Path) -> None:
    s = load(tmp_path, {"checkpoint": {"allowed_hosts": ["127.0.0.1", "10.0.0.0/8"]}})
    policy = s.checkpoint.url_policy()
    assert policy.require_pod_ip and len(policy.networks) == 2
    off = load(tmp_path, {}, env={"RECLAIMD_CHECKPOINT__REQUIRE_POD_IP": "false"})
    assert not off.checkpoint.url_policy().require_pod_ip


def test_nested_sections_and_their_parts(tmp_path: Path) -> None:
    s = load(
        tmp_path,
        {
            "cache": {"namespaces": ["a"], "watch": {"page_size": 500}},
            "claims": {"max_conflicts": 3},
            "kube": {"retry_cap_s": 2},
            "ledger": {"writer": {"batch_size": 10}},
            "events": {"series_cache": 16},
            "intake": {"memory": 1000},
        },
    )
    assert s.cache.watch.page_size == 500 and s.cache.namespaces == ("a",)
    assert s.claims.max_conflicts == 3 and s.kube.retry_cap_s == 2.0
    assert s.ledger.writer.batch_size == 10
    assert s.events.series_cache == 16 and s.intake.memory == 1000


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"checkpoint": {"allowed_hosts": ["http://evil"]}}, "checkpoint.allowed_hosts: "),
        ({"checkpoint": {"allowed_hosts": ["10.0.0.1/8"]}}, "not a host name, IP address or CIDR"),
        (
            {"checkpoint": {"alowed_hosts": []}},
            "checkpoint.alowed_hosts: not a setting: did you mean checkpoint.allowed_hosts",
        ),
        ({"cache": {"watch": {"page_size": 0}}}, "cache.watch.page_size: "),
        ({"cache": {"stall_after_s": -1}}, "cache.stall_after_s: "),
        ({"claims": {"max_conflicts": "many"}}, "claims.max_conflicts: "),
        ({"kube": {"max_attempts": 0}}, "kube.max_attempts: "),
        ({"ledger": {"writer": {"batch_size": 0}}}, "ledger.writer.batch_size: "),
        ({"policy": {"poll_interval_s": 0}}, "policy.poll_interval_s: "),
        ({"intake": {"memory": 1}}, "intake.memory: "),
    ],
)
def test_bad_values_are_one_line(tmp_path: Path, data: object, says: str) -> None:
    with pytest.raises(config.ConfigError, match=says) as e:
        load(tmp_path, data)
    assert "\n" not in str(e.value)


def test_the_chart_values_are_a_valid_config(tmp_path: Path) -> None:
    chart = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "reclaimd" / "values.yaml"
    values = yaml.safe_load(chart.read_text())
    s = load(tmp_path, values["config"])
    assert s.checkpoint.require_pod_ip and s.checkpoint.allowed_hosts == ()
