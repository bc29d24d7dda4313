"""Write the chart's view of the source registry (``reclaimd.sources.REGISTRY``).

- ``reclaimd/files/sources.json``: every source's settings section, those whose ``slots``
  default to the controller's replicas, and each node-agent source's ``nodeAgent.source``
  value, section and whether it reads its node's name. The templates read it
  (``.Files.Get``): the agent turns every source off but its own.
- ``reclaimd/values.schema.json``: the ``nodeAgent.source`` enum.

    python deploy/helm/gen_sources.py          # write
    python deploy/helm/gen_sources.py --check  # exit 1 naming a stale file

tests/unit/test_source_identity.py fails when either file differs from what this writes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reclaimd.sources import Entry

CHART = Path(__file__).resolve().parent / "reclaimd"
SOURCES = CHART / "files" / "sources.json"
SCHEMA = CHART / "values.schema.json"


def sources_doc(registry: Iterable[Entry[Any]]) -> dict[str, Any]:
    entries = list(registry)
    return {
        "sources": [e.name for e in entries],
        "slotted": [e.name for e in entries if e.slotted],
        "agents": {
            e.agent: {"section": e.name, "nodeName": e.agent_node_name} for e in entries if e.agent
        },
    }


def schema_doc(current: dict[str, Any], registry: Iterable[Entry[Any]]) -> dict[str, Any]:
    agents = [e.agent for e in registry if e.agent]
    current["properties"]["nodeAgent"]["properties"]["source"]["enum"] = agents
    return current


def dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def generated() -> dict[Path, str]:
    """Each file's content as the registry says it should be."""
    from reclaimd.sources import REGISTRY

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
