"""Guarded PutObject against the local S3 (moto server) of the e2e stack."""

import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import botocore.exceptions
import pytest

from reclaimd.model import utcnow
from reclaimd_trainer.s3 import GuardedPut, PutFailed, ScopeRefused, make_s3_client

pytestmark = pytest.mark.e2e


class Counting:
    """The real client's put_object, counted: proves when no request was made."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls = 0

    def put_object(self, **kw: Any) -> Mapping[str, Any]:
        self.calls += 1
        result: Mapping[str, Any] = self.client.put_object(**kw)
        return result


@pytest.fixture
def s3(stack: Any) -> Any:
    return make_s3_client(endpoint_url=stack.aws_endpoint)


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


async def test_allowed_prefix_is_written_and_reads_back(s3: Any, bucket: str) -> None:
    counting = Counting(s3)
    guard = GuardedPut(counting)
    key = "checkpoints/acme/llm/step-000100/rank-0.pt"
    body = b"\x00weights\xff" * 1000
    out = await guard.put(
        "acme", bucket, key, body, deadline=utcnow() + timedelta(seconds=30), ContentType="x/pt"
    )
    assert out["ETag"]
    got = s3.get_object(Bucket=bucket, Key=key)
    assert got["Body"].read() == body
    assert got["ContentType"] == "x/pt"
    c = guard.counters("acme")
    assert (counting.calls, c.attempts, c.succeeded, c.retries) == (1, 1, 1, 0)


async def test_bound_put_returns_the_uri_of_a_real_object(s3: Any, bucket: str) -> None:
    store = GuardedPut(s3).bind("acme", bucket)
    uri = await store.put(
        "checkpoints/acme/m.json", b"{}", deadline=utcnow() + timedelta(seconds=30)
    )
    assert uri == f"s3://{bucket}/checkpoints/acme/m.json"
    assert s3.get_object(Bucket=bucket, Key="checkpoints/acme/m.json")["Body"].read() == b"{}"


@pytest.mark.parametrize(
    "key", ["checkpoints/globex/x.pt", "checkpoints/acme/../globex/x.pt", "/checkpoints/acme/x"]
)
async def test_foreign_prefix_is_refused_without_a_request(s3: Any, bucket: str, key: str) -> None:
    counting = Counting(s3)
    guard = GuardedPut(counting)
    with pytest.raises(ScopeRefused):
        await guard.put("acme", bucket, key, b"x", deadline=utcnow() + timedelta(seconds=30))
    assert counting.calls == 0
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    assert guard.counters("acme").scope_refused == 1


async def test_a_4xx_from_the_server_is_not_retried(s3: Any) -> None:
    counting = Counting(s3)
    guard = GuardedPut(counting)
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    with pytest.raises(PutFailed) as err:
        await guard.put(
            "acme", missing, "checkpoints/acme/x", b"x", deadline=utcnow() + timedelta(seconds=30)
        )
    assert err.value.reason == "rejected"
    assert err.value.code == "NoSuchBucket"
    assert isinstance(err.value.__cause__, botocore.exceptions.ClientError)
    assert counting.calls == 1
