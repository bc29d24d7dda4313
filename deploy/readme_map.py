"""Write the README's map of every module (between its ``<!-- map -->`` markers): each
module of the product (reclaimd/, handlers/, reclaimd_trainer/) and of the rig (chaos/), by
path, with the first sentence of its docstring.

    python deploy/readme_map.py          # write
    python deploy/readme_map.py --check  # exit 1 when the README's map is stale

tests/unit/test_readme_map.py runs the check: a module added, moved or re-described without
the map following fails it.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
ROOTS = ("handlers", "reclaimd", "reclaimd_trainer", "chaos")
START, END = "<!-- map: written by deploy/readme_map.py -->", "<!-- /map -->"
WIDTH = 100


def modules() -> list[Path]:
    found: list[Path] = []
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO)
            # reclaimd/handlers is the link to handlers/: its modules are listed there.
            if rel.parts[:2] == ("reclaimd", "handlers") or "__pycache__" in rel.parts:
                continue
            found.append(rel)
    return found


def summary(path: Path) -> str:
    """The first sentence of the module's docstring, on one line ("" for none)."""
    doc = ast.get_docstring(ast.parse((REPO / path).read_text(encoding="utf-8"))) or ""
    text = " ".join(doc.split())
    match = re.match(r"(.+?[.:;])(\s|$)", text)
    sentence = match.group(1) if match else text
    return sentence.rstrip(".:;")


def block() -> str:
    lines = [START, "", "| module | what it holds |", "|---|---|"]
    for path in modules():
        text = summary(path).replace("|", "\\|") or "(package)"
        lines.append(f"| `{path.as_posix()}` | {text} |")
    lines += ["", END]
    return "\n".join(lines)


def rewritten(readme: str) -> str:
    start, end = readme.index(START), readme.index(END) + len(END)
    return readme[:start] + block() + readme[end:]


def main(argv: list[str]) -> int:
    readme = README.read_text(encoding="utf-8")
    if START not in readme or END not in readme:
        print(f"{README}: no {START} ... {END} markers", file=sys.stderr)
        return 2
    new = rewritten(readme)
    if argv == ["--check"]:
        if new != readme:
            print(f"{README}: the module map is stale, run deploy/readme_map.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
