from pathlib import Path

import pytest

from reclaimd import config
from reclaimd.config import ConfigError
from reclaimd.settings.policy import EvictionPolicy


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_empty_file_is_safe_defaults(tmp_path: Path) -> None:
    s = config.load(write(tmp_path, ""), env={})
    assert s.policy.eviction is EvictionPolicy.FORCE_NEAR_DEADLINE
    assert s.windows.ec2_spot_s == 120.0 and s.windows.gce_preemption_s == 30.0
    assert not s.sqs.enabled and not s.imds.enabled


def test_yaml_and_env_overrides(tmp_path: Path) -> None:
    q1, q2 = "https://sqs.us-east-2.amazonaws.com/1/q1", "https://sqs.us-east-2.amazonaws.com/1/q2"
    p = write(tmp_path, f"sqs:\n  enabled: true\n  queue_url: {q1}\nwindows:\n  ec2_spot_s: 90\n")
    s = config.load(p, env={"RECLAIMD_SQS__QUEUE_URL": q2, "RECLAIMD_LEDGER__TOPIC": "t"})
    assert s.sqs.enabled and s.sqs.queue_url == q2
    assert s.windows.ec2_spot_s == 90.0
    assert s.ledger.topic == "t"


@pytest.mark.parametrize(
    ("text", "env", "needle"),
    [
        ("sqs:\n  batch_size: 11\n", {}, "sqs.batch_size"),
        ("polcy: {}\n", {}, "polcy"),
        ("- a\n- b\n", {}, "mapping"),
        ("a: [\n", {}, "YAML"),
        ("", {"RECLAIMD_POLICY__EVICTION": "yolo"}, "policy.eviction"),
    ],
)
def test_bad_config_is_one_line(
    tmp_path: Path, text: str, env: dict[str, str], needle: str
) -> None:
    with pytest.raises(ConfigError) as e:
        config.load(write(tmp_path, text), env=env)
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        config.load(tmp_path / "nope.yaml", env={})


def test_tooling_variables_are_not_settings(tmp_path: Path) -> None:
    s = config.load(None, env={"RECLAIMD_STACK_DIR": "/x", "RECLAIMD_KUBECONFIG": "/y"})
    assert s.kube.kubeconfig is None
    with pytest.raises(ConfigError, match=r"sqs\.queue_ulr"):
        config.load(None, env={"RECLAIMD_SQS__QUEUE_ULR": "q"})
