"""The README's map of every module (deploy/readme_map.py) is current: each module of the
product and the rig is listed by path, with its docstring's first sentence."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("readme_map", REPO / "deploy" / "readme_map.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["readme_map"] = module
    spec.loader.exec_module(module)
    return module


def test_the_map_lists_every_module_and_is_current() -> None:
    script = _script()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert script.rewritten(readme) == readme, "stale: run deploy/readme_map.py"
    listed = {line.split("`")[1] for line in readme.splitlines() if line.startswith("| `")}
    on_disk = {p.as_posix() for p in script.modules()}
    assert on_disk == listed
    # The product's every package is there (a walk that found nothing would pass above).
    for root in ("handlers/sqs/parser.py", "reclaimd/pipeline.py", "reclaimd_trainer/torch.py",
                 "chaos/drill/run.py"):  # fmt: skip
        assert root in listed


def test_a_module_missing_from_the_map_is_found() -> None:
    script = _script()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    dropped = (
        "\n".join(
            line for line in readme.splitlines() if not line.startswith("| `reclaimd/pipeline.py`")
        )
        + "\n"
    )
    assert script.rewritten(dropped) != dropped
    assert script.main(["--check"]) == 0
