"""Build the reclaimd-trainer wheel: ``python deploy/trainer/sdk/build.py OUT_DIR``.

Stages the SDK's modules (and nothing else of reclaimd) beside this directory's
pyproject.toml in a temporary directory and builds a wheel there, offline (no build
isolation: setuptools comes from the environment). Prints the wheel's path.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
# What reclaimd.trainer imports of reclaimd: tests/unit/test_trainer_dist.py keeps this true.
MODULES = ("__init__.py", "model.py", "putbudget.py", "py.typed")


def build(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="reclaimd-trainer-") as tmp:
        stage = Path(tmp)
        shutil.copy(HERE / "pyproject.toml", stage / "pyproject.toml")
        package = stage / "reclaimd"
        package.mkdir()
        for name in MODULES:
            if (REPO / "reclaimd" / name).exists():
                shutil.copy(REPO / "reclaimd" / name, package / name)
        shutil.copytree(
            REPO / "reclaimd" / "trainer",
            package / "trainer",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        before = set(out.glob("reclaimd_trainer-*.whl"))
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
             "--no-build-isolation", "--wheel-dir", str(out), str(stage)],
            check=True,
        )  # fmt: skip
    made = sorted(set(out.glob("reclaimd_trainer-*.whl")) - before) or sorted(
        out.glob("reclaimd_trainer-*.whl")
    )
    return made[-1]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build.py OUT_DIR")
    print(build(Path(sys.argv[1])))
