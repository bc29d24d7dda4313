"""The kafka_notices source's settings: the generic CloudEvents notices topic."""

from __future__ import annotations

from pydantic import Field, model_validator

from reclaimd.handlers.entry import SourceSettings


class KafkaNoticeSettings(SourceSettings):
    """A generic notices topic: CloudEvents 1.0 JSON, one consumer group for all replicas."""

    bootstrap: str = ""
    topic: str = "reclaimd.notices"
    group_id: str = "reclaimd"
    # A replica silent this long loses its partitions to a peer (brokers bound it by
    # group.min/max.session.timeout.ms, 6 s .. 30 min by default). A stopping one leaves the
    # group at once, and a peer hears of it at its next heartbeat: hence 1 s, not 3 s.
    session_timeout_ms: int = Field(10_000, ge=1_000, le=1_800_000)
    heartbeat_interval_ms: int = Field(1_000, ge=100)

    @model_validator(mode="after")
    def _heartbeat_within_session(self) -> KafkaNoticeSettings:
        # Kafka's advice, a third at most: two lost heartbeats do not end the session.
        if self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms: at most a third of session_timeout_ms")
        return self

    def destination(self) -> str:
        return self.topic

    def needs(self) -> dict[str, str]:
        found = {}
        if not self.bootstrap.strip(" ,"):
            found["bootstrap"] = "not set: set it to the notices' brokers, host:port[,host:port]"
        if not self.topic:
            found["topic"] = "not set: set it to the topic the notices are produced to"
        return found
