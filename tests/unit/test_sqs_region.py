"""The SQS region comes from where reclaimd runs: the queue URL, then AWS_REGION (issue 35)."""

from __future__ import annotations

import pytest

from reclaimd.config import Settings
from reclaimd.handlers.sqs.settings import SqsSettings, sqs_region


@pytest.mark.parametrize(
    ("url", "env", "region"),
    [
        ("https://sqs.eu-west-1.amazonaws.com/123456789012/reclaimd", {}, "eu-west-1"),
        ("https://sqs.cn-north-1.amazonaws.com.cn/123456789012/q", {}, "cn-north-1"),
        ("https://ap-south-1.queue.amazonaws.com/123456789012/q", {}, "ap-south-1"),
        ("https://sqs.us-east-2.amazonaws.com/1/q", {"AWS_REGION": "eu-central-1"}, "us-east-2"),
        ("http://localhost:5000/123456789012/q", {"AWS_REGION": "eu-central-1"}, "eu-central-1"),
        ("http://localhost:5000/1/q", {"AWS_DEFAULT_REGION": "sa-east-1"}, "sa-east-1"),
        ("", {"AWS_REGION": "ca-central-1", "AWS_DEFAULT_REGION": "x"}, "ca-central-1"),
        ("", {}, "us-east-1"),
    ],
)
def test_region_from_url_then_environment(url: str, env: dict[str, str], region: str) -> None:
    assert sqs_region(url, env) == region


def test_settings_take_the_queue_urls_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-northeast-1")
    url = "https://sqs.eu-west-3.amazonaws.com/123456789012/reclaimd-interruptions"
    assert SqsSettings(queue_url=url).region == "eu-west-3"
    s = Settings.model_validate({"sqs": {"enabled": True, "queue_url": url}})
    assert s.sqs.region == "eu-west-3"
    # Said outright, the region wins; a URL without one (moto, a VPC endpoint): the environment.
    assert SqsSettings(queue_url=url, region="us-west-2").region == "us-west-2"
    assert SqsSettings(queue_url="http://moto:5000/1/q").region == "ap-northeast-1"
