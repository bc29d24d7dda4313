"""The sqs source's settings: the EventBridge -> SQS queue of EC2 Spot, rebalance, scheduled
and ASG lifecycle events."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from reclaimd.handlers.entry import SourceSettings, unless_url


def sqs_region(queue_url: str, env: Mapping[str, str]) -> str:
    """Where an SQS queue is: the region its URL names (``https://sqs.<region>.amazonaws.com/``,
    ``.amazonaws.com.cn``, the legacy ``<region>.queue.amazonaws.com``), else ``AWS_REGION``,
    ``AWS_DEFAULT_REGION`` (what IRSA and Pod Identity set), else us-east-1."""
    host = queue_url.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0].lower()
    labels = host.split(".")
    if "amazonaws" in labels:
        if labels[0] == "sqs" and len(labels) > 2 and labels[1] != "amazonaws":
            return labels[1]
        if len(labels) > 2 and labels[1] == "queue":
            return labels[0]
    return env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"


class SqsSettings(SourceSettings):
    queue_url: str = ""
    endpoint_url: str | None = None  # moto, LocalStack or a VPC endpoint
    # Empty: from queue_url, else AWS_REGION / AWS_DEFAULT_REGION, else us-east-1 (sqs_region).
    region: str = ""
    wait_time_s: int = Field(20, ge=0, le=20)
    batch_size: int = Field(10, ge=1, le=10)
    # Long polls in parallel: one receive loop caps ingest at a batch per round trip.
    receivers: int = Field(4, ge=1, le=32)
    # Messages being admitted at once (claim, then delete), across the receivers. More at
    # once is not faster: in a 1,000-notice bench, 512 missed more deadlines than 64 (every
    # admitted notice's writes compete for the same API server).
    concurrency: int = Field(64, ge=1, le=1000)
    # Short, and extended every third of it while a message is unsettled: a replica that dies
    # holding a message hands it to a peer after this long, not after SQS's 30 s default.
    visibility_timeout_s: int = Field(10, ge=5, le=43200)

    @model_validator(mode="before")
    @classmethod
    def _region_from_where_it_runs(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and not data.get("region"):
            url = data.get("queue_url") or ""
            return {**data, "region": sqs_region(url if isinstance(url, str) else "", os.environ)}
        return data

    def destination(self) -> str:
        return self.queue_url.rsplit("/", 1)[-1]

    def needs(self) -> dict[str, str]:
        like = "the queue's URL, https://sqs.<region>.amazonaws.com/<account>/<queue>"
        found = unless_url("queue_url", self.queue_url, like)
        if not found and len([p for p in urlsplit(self.queue_url).path.split("/") if p]) != 2:
            found["queue_url"] = f"{self.queue_url!r} names no <account>/<queue>: set it to {like}"
        if self.endpoint_url is not None:
            found |= unless_url("endpoint_url", self.endpoint_url, "an SQS endpoint, or unset it")
        return found
