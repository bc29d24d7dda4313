"""The tree's layout: real top-level packages (handlers/ imported as reclaimd.handlers), the
rig kept out of the product and the image (pure: reads the checkout)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RIG = re.compile(r"^(bench|bench_\w+|hostile|faultproxy|drill|campaign)\.py$")


def test_no_symlinks_in_the_packages() -> None:
    """But one: reclaimd/handlers is the top-level handlers/ folder, so that it is imported
    as reclaimd.handlers by the checkout, setuptools, mypy and import-linter alike (the last
    two read the file system, not the editable install's finder)."""
    links = [
        str(p.relative_to(REPO))
        for top in ("reclaimd", "handlers", "chaos")
        for p in (REPO / top).rglob("*")
        if p.is_symlink()
    ]
    assert links == ["reclaimd/handlers"]
    assert (REPO / "reclaimd" / "handlers").readlink() == Path("../handlers")


def test_the_product_package_holds_no_rig_module() -> None:
    assert [p.name for p in (REPO / "reclaimd").rglob("*.py") if RIG.match(p.name)] == []
    assert (REPO / "chaos" / "bench" / "storm.py").is_file()
    assert (REPO / "chaos" / "bench" / "report.py").is_file()


def test_the_image_archives_the_product_alone() -> None:
    """deploy/image/build.sh builds the image's wheel from these paths: chaos/ is not one."""
    text = (REPO / "deploy" / "image" / "build.sh").read_text()
    m = re.search(r"^IMAGE_PATHS=\(([^)]*)\)", text, re.M)
    assert m is not None
    paths = m.group(1).split()
    assert {"reclaimd", "handlers", "pyproject.toml"} <= set(paths)
    assert "chaos" not in paths
