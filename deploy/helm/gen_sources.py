"""Write the chart's view of the source registry (``reclaimd.handlers.REGISTRY``).

- ``reclaimd/files/sources.json``: every source's settings section, those whose ``slots``
  default to the controller's replicas, those that read Kafka (a ``bootstrap``: the
  NetworkPolicy's Kafka egress), and each node-agent source's ``nodeAgent.source`` value,
  section and whether it reads its node's name. The templates read it (``.Files.Get``):
  the agent turns every source off but its own.
- ``reclaimd/values.schema.json``: the ``nodeAgent.source`` enum, and the ``config`` subtree:
  the settings model's JSON schema (``reclaimd.config.settings_model`` over the registry: every
  section, the sources' included), its references inlined, unknown keys refused, so that a
  typo under ``config.`` fails ``helm install`` as it would fail reclaimd. Nothing else in
  the schema is touched.

    python deploy/helm/gen_sources.py          # write
    python deploy/helm/gen_sources.py --check  # exit 1 naming a stale file

tests/unit/test_source_identity.py fails when either file differs from what this writes.
"""

from __future__ import annotations

import copy
import json
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reclaimd.handlers.entry import Entry

CHART = Path(__file__).resolve().parent / "reclaimd"
SOURCES = CHART / "files" / "sources.json"
SCHEMA = CHART / "values.schema.json"


def sources_doc(registry: Iterable[Entry[Any]]) -> dict[str, Any]:
    entries = list(registry)
    return {
        "sources": [e.name for e in entries],
        "slotted": [e.name for e in entries if e.slotted],
        # Sources that read Kafka (a ``bootstrap`` setting): the NetworkPolicy's Kafka egress.
        "kafka": [e.name for e in entries if "bootstrap" in e.model.model_fields],
        "agents": {
            e.agent: {"section": e.name, "nodeName": e.agent_node_name} for e in entries if e.agent
        },
    }


# What the chart says of config beyond the model (the chart's own defaulting).
CONFIG_NOTES = {
    (): "reclaimd settings (reclaimd/config.py), generated from the settings model by "
    "deploy/helm/gen_sources.py: a key the model does not know fails here",
    ("pubsub", "slots"): "Pub/Sub subscriptions, one per replica slot (<subscription>-<i>); "
    "default: controller.replicas; 1: one shared subscription",
}


def config_schema(registry: Iterable[Entry[Any]]) -> dict[str, Any]:
    """The settings model's JSON schema as one tree (draft-07 has no $defs: refs inlined)."""
    from pydantic.json_schema import PydanticJsonSchemaWarning

    from reclaimd.config import settings_model

    with warnings.catch_warnings():
        # A default that is not JSON (the windows' dataclass) is left out of the schema.
        warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
        doc = settings_model(registry).model_json_schema()
    defs = doc.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                rest = {k: v for k, v in node.items() if k != "$ref"}
                node = {**copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]]), **rest}
            return {k: inline(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    tree: dict[str, Any] = inline(doc)
    for path, note in CONFIG_NOTES.items():
        node = tree
        for key in path:
            node = node["properties"][key]
        node["description"] = note
    return tree


def schema_doc(current: dict[str, Any], registry: Iterable[Entry[Any]]) -> dict[str, Any]:
    registry = list(registry)
    agents = [e.agent for e in registry if e.agent]
    current["properties"]["nodeAgent"]["properties"]["source"]["enum"] = agents
    current["properties"]["config"] = config_schema(registry)
    return current


def dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def generated() -> dict[Path, str]:
    """Each file's content as the registry says it should be."""
    from reclaimd.handlers import REGISTRY

    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    return {SOURCES: dump(sources_doc(REGISTRY)), SCHEMA: dump(schema_doc(schema, REGISTRY))}


def main(argv: list[str]) -> int:
    stale = []
    for path, text in generated().items():
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        if "--check" in argv:
            stale.append(path)
        else:
            path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{path}: stale, run deploy/helm/gen_sources.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.path.insert(0, str(CHART.parents[2]))
    sys.exit(main(sys.argv[1:]))
