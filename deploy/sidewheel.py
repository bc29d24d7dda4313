"""What the side wheels' build scripts share (deploy/trainer/sdk/build.py and
deploy/chaos/build.py): a package staged in a temporary directory beside its pyproject.toml,
built into a wheel there, offline (no build isolation: setuptools comes from the
environment)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_staged(
    pyproject: Path, out: Path, stem: str, stage: Callable[[Path], None], at: Path = Path(".")
) -> Path:
    """``stage(directory)`` puts the package's files in ``directory``; the wheel built from
    them into ``out`` (``<stem>-*.whl``), its path. ``at``: where the pyproject goes under
    ``directory`` (one that names its package by a relative path keeps its place)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{stem}-") as tmp:
        directory = Path(tmp)
        project = directory / at
        project.mkdir(parents=True, exist_ok=True)
        shutil.copy(pyproject, project / "pyproject.toml")
        stage(directory)
        before = set(out.glob(f"{stem}-*.whl"))
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
             "--no-build-isolation", "--wheel-dir", str(out), str(project)],
            check=True,
        )  # fmt: skip
    made = sorted(set(out.glob(f"{stem}-*.whl")) - before) or sorted(out.glob(f"{stem}-*.whl"))
    return made[-1]
