"""The kafka_notices source: a generic notices topic of CloudEvents 1.0 JSON, one consumer group
for all replicas.

Its folder holds all of it: ``parser`` (pure: payload bytes -> notices), ``settings`` (its
section of ``Settings``), ``transport`` (imported only when it is enabled: its client library
with it). ``ENTRY`` is what the registry (``reclaimd.handlers``) reads.
"""

from __future__ import annotations

from reclaimd.handlers.entry import Entry, Origin
from reclaimd.handlers.kafka_notices import parser
from reclaimd.handlers.kafka_notices.settings import KafkaNoticeSettings

ENTRY = Entry(
    "kafka_notices", KafkaNoticeSettings,
    Origin("kafka:", messaging="kafka", label="kafka"),
    parse=parser.parse,
    aliases=("kafka",),
    order=7,
)  # fmt: skip
