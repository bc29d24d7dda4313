"""The sqs source: EC2 Spot interruptions, rebalance recommendations, scheduled events and
ASG lifecycle hooks, as EventBridge routes them to an SQS queue.

Its folder holds all of it: ``parser`` (pure: payload bytes -> notices), ``settings`` (its
section of ``Settings``), ``transport`` (imported only when it is enabled: its client library
with it) and ``lifecycle`` (completing an ASG lifecycle action once drained). ``ENTRY`` is what
the registry (``reclaimd.handlers``) reads.
"""

from __future__ import annotations

from reclaimd.handlers.entry import Entry, Origin
from reclaimd.handlers.sqs import parser
from reclaimd.handlers.sqs.settings import SqsSettings
from reclaimd.handlers.targets import ec2_arn

ENTRY = Entry(
    "sqs", SqsSettings,
    Origin("aws.", "aws", "aws_ec2", messaging="aws_sqs", resource_id=ec2_arn),  # EventBridge
    parse=parser.parse, windows=parser.WINDOWS,
    after_drain="lifecycle", facts=(parser.AsgLifecycleFacts,),
    aliases=("ec2",),
    order=1,
)  # fmt: skip
