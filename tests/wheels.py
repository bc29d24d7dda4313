"""Building the project's wheels and fresh venvs to install them in, for the distribution tests
(test_trainer_dist, test_chaos_dist) and the trainer docs' e2e test.

No index here: wheels go in with ``--no-deps``, and a fresh venv reaches libraries through a
``site.addsitedir`` of a directory of links to the dev venv's installed ones, minus what a test
must not see (the checkout's own packages, the frameworks).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SDK_BUILD = REPO / "deploy" / "trainer" / "sdk" / "build.py"
# Never linked into a fresh venv: the checkout's distributions and their editable finders.
OURS = ("reclaimd", "__editable__", "chaos", "handlers")


def run(
    *cmd: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(c) for c in cmd],
        capture_output=True, text=True, timeout=600, check=False, env=env, cwd=cwd,
    )  # fmt: skip
    assert done.returncode == 0, f"{[str(c) for c in cmd[:6]]}: {done.stderr[-2000:]}"
    return done


def sdk_wheel(out: Path) -> Path:
    """reclaimd-trainer's wheel, as `make sdk-wheel` builds it."""
    built = run(sys.executable, SDK_BUILD, out)
    return Path(built.stdout.strip().splitlines()[-1])


def product_wheel(out: Path) -> Path:
    """reclaimd's wheel as the image builds it: from the product files, without chaos/ (and
    with reclaimd_trainer/ beside them, as in the checkout: it must not end up in it)."""
    stage = out / "product"
    stage.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, stage / name)
    for top in ("reclaimd", "handlers", "reclaimd_trainer"):
        shutil.copytree(REPO / top, stage / top, ignore=shutil.ignore_patterns("__pycache__"))
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
        "--wheel-dir", out, stage)  # fmt: skip
    (wheel,) = out.glob("reclaimd-*.whl")
    return wheel


def dependency_links(into: Path, leave_out: Iterable[str] = ()) -> Path:
    """The dev venv's site-packages as links, less the checkout's own and ``leave_out``
    (prefixes of normalized names)."""
    skip = (*OURS, *leave_out)
    into.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if not entry.name.lower().replace("-", "_").startswith(skip):
            (into / entry.name).symlink_to(entry)
    return into


def fresh_venv(where: Path, links: Path | None = None) -> Path:
    """A venv without pip (the dev venv's pip installs into it); its python. ``links``: a
    directory of libraries it may import (``dependency_links``)."""
    run(sys.executable, "-m", "venv", "--without-pip", where)
    python = where / "bin" / "python"
    if links is not None:
        purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        (Path(purelib.stdout.strip()) / "zz_deps.pth").write_text(
            f"import site; site.addsitedir({str(links)!r})\n"
        )
    return python


def pip(python: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """The dev venv's pip acting on another venv, offline."""
    return run(sys.executable, "-m", "pip", "--python", python, *args)


def outside_env() -> dict[str, str]:
    """The environment without PYTHON* (the unit tests run with a PYTHONPATH): a subprocess
    run with it, from outside the checkout, imports only what its venv holds."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
