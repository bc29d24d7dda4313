"""The modules of the tree that cannot be imported without a training framework (torch,
Lightning, transformers, accelerate): the trainer SDK's integrations (reclaimd_trainer's torch,
routine, lightning and hf: its own wheel has them) and the rig's torch jobs. The controller
image (which carries the SDK for the contract it speaks) and the reclaimd-chaos wheel carry no
framework, so they leave these out, and their builds import every module they do ship.

``python deploy/image/torch_modules.py ROOT [PACKAGE...]`` prints their paths relative to
ROOT, one a line (default packages: reclaimd reclaimd_trainer handlers chaos).

A module is in when an import it runs at import time names a framework or a module that is
in (its own parent packages count: importing ``a.b.c`` runs ``a.b``). Imports inside a
function, under ``if TYPE_CHECKING:`` or in a ``try`` that catches ImportError do not count:
the module imports without them. tests/unit/test_image_modules.py checks the result by
importing every module with the frameworks refused.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

FRAMEWORKS = frozenset({"torch", "lightning", "pytorch_lightning", "transformers", "accelerate"})
PACKAGES = ("reclaimd", "reclaimd_trainer", "handlers", "chaos")
_OPTIONAL = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _catches_import_error(node: ast.Try) -> bool:
    for h in node.handlers:
        if h.type is None:
            return True
        names = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        if any(isinstance(n, ast.Name) and n.id in _OPTIONAL for n in names):
            return True
    return False


def _run_at_import(body: Iterable[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _type_checking(node.test):
                yield from _run_at_import(node.body)
            yield from _run_at_import(node.orelse)
        elif isinstance(node, ast.Try):
            if not _catches_import_error(node):
                yield from _run_at_import(node.body)
            for h in node.handlers:
                yield from _run_at_import(h.body)
            yield from _run_at_import([*node.orelse, *node.finalbody])
        elif isinstance(node, ast.With | ast.For | ast.While | ast.ClassDef):
            yield from _run_at_import(node.body)
            yield from _run_at_import(getattr(node, "orelse", []))


def imports_at_import_time(source: str, name: str, is_package: bool) -> set[str]:
    """Every module name an import in ``source`` (module ``name``) may load when it runs."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _run_at_import(ast.parse(source).body):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
            continue
        base = node.module or ""
        if node.level:
            up = package.split(".")
            up = up[: len(up) - (node.level - 1)]
            base = ".".join([*up, base] if base else up)
        found.add(base)
        found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import submodule`
    return found


def torch_modules(root: Path, packages: Sequence[str] = PACKAGES) -> list[str]:
    """Paths (relative to ``root``, sorted) of the modules of ``packages`` that need a framework.
    The whole tree is read, so a module needing one through another package counts."""
    files = {
        module_name(root, p): p
        for top in PACKAGES
        if (root / top).is_dir()
        for p in sorted((root / top).rglob("*.py"))
        if "__pycache__" not in p.parts
    }
    deps: dict[str, set[str]] = {}
    for name, path in files.items():
        found = imports_at_import_time(path.read_text(), name, path.name == "__init__.py")
        parts = name.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts)))
        deps[name] = found
    needs = {n for n, found in deps.items() if {f.split(".")[0] for f in found} & FRAMEWORKS}
    while True:
        more = {n for n, found in deps.items() if n not in needs and found & needs}
        if not more:
            break
        needs |= more
    wanted = tuple(packages)
    return sorted(str(files[n].relative_to(root)) for n in needs if n.split(".")[0] in wanted)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: torch_modules.py ROOT [PACKAGE...]")
    for line in torch_modules(Path(sys.argv[1]), sys.argv[2:] or PACKAGES):
        print(line)
