"""The map of durable state (reclaimd.durable) against the code, both ways, so it cannot rot.

Read from the source tree, not imported by path: a module that moves (the Pub/Sub slots go
with their source) is still found wherever it is.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from reclaimd import durable, sources
from reclaimd.cluster import claims, taints
from reclaimd.config import LedgerSettings, TracingSettings

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [*(ROOT / "reclaimd").rglob("*.py"), *(ROOT / "handlers").rglob("*.py")]
NAME_PREFIX = re.compile(r"[a-z][a-z0-9-]*-")


def _module_strings(tree: ast.Module) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            out.update({t.id: value.value for t in targets if isinstance(t, ast.Name)})
    return out


def _lease_prefixes() -> set[str]:
    """The name prefixes every ``*lease_name``/``*record_name`` function of the product builds
    its Lease names from (literals, or module constants it names)."""
    found: set[str] = set()
    for path in PRODUCT:
        tree = ast.parse(path.read_text(), str(path))
        consts = _module_strings(tree)
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            if not fn.name.endswith(("lease_name", "record_name")):
                continue
            for node in ast.walk(fn):
                text = node.value if isinstance(node, ast.Constant) else None
                if isinstance(node, ast.Name):
                    text = consts.get(node.id)
                if isinstance(text, str) and NAME_PREFIX.fullmatch(text):
                    found.add(text)
    return found


def _beside_outbox_suffixes() -> set[str]:
    found: set[str] = set()
    for path in PRODUCT:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "beside_outbox"
            ):
                arg = node.args[0]
                assert isinstance(arg, ast.Constant), f"{path}: a beside_outbox suffix not literal"
                found.add(arg.value)
    return found


def test_the_map_names_every_record_the_code_keeps_and_nothing_else() -> None:
    slotted = [e.name for e in sources.REGISTRY if e.slotted]
    leases = {r.where for r in durable.of(durable.Kind.LEASE) if r.where != durable.SLOT_PREFIX}
    leases |= {durable.SLOT_PREFIX.format(source=name) for name in slotted}
    assert leases == _lease_prefixes()
    assert durable.beside_outbox_suffixes() == _beside_outbox_suffixes()
    files = {r.where for r in durable.of(durable.Kind.FILE)} - durable.beside_outbox_suffixes()
    assert files == {str(LedgerSettings().outbox_path), str(TracingSettings().span_file)}
    assert {r.where for r in durable.of(durable.Kind.ANNOTATION)} == {claims.CLAIM_ANNOTATION}
    assert {r.where for r in durable.of(durable.Kind.TAINT)} == {taints.TAINT_KEY}
    assert len({r.name for r in durable.RECORDS}) == len(durable.RECORDS)
    assert all(r.writer and r.lifetime and r.deleted_by for r in durable.RECORDS)
