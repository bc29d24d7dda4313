"""The imds source: a per-node poller of EC2 instance metadata (Spot instance-action,
rebalance recommendation, scheduled maintenance).

Its folder holds all of it: ``parser`` (pure: payload bytes -> notices), ``settings`` (its
section of ``Settings``), ``transport`` (imported only when it is enabled: its client library
with it). ``ENTRY`` is what the registry (``reclaimd.handlers``) reads.
"""

from __future__ import annotations

from reclaimd.handlers.entry import Entry, Origin
from reclaimd.handlers.imds import parser
from reclaimd.handlers.imds.settings import ImdsSettings
from reclaimd.handlers.targets import ec2_arn

ENTRY = Entry(
    "imds", ImdsSettings,
    Origin("aws.imds.", "aws", "aws_ec2", transport="imds", resource_id=ec2_arn),
    parse=parser.parse, parse_saved=parser.parse_saved, windows=parser.WINDOWS,
    agent="imds",
    order=2,
)  # fmt: skip
