"""What the controller image and the reclaimd-chaos wheel leave out: the modules that cannot be
imported without a training framework (deploy/image/torch_modules.py). Checked against the
interpreter: with torch, Lightning, transformers and accelerate refused, each module left out
fails to import and every other module of reclaimd, reclaimd_trainer, handlers and chaos
imports."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("torch", "lightning", "pytorch_lightning", "transformers", "accelerate")

PROGRAM = textwrap.dedent(
    """
    import importlib, importlib.abc, json, sys

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in sys.argv[1].split(","):
                raise ImportError(f"refused in this test: {name}")
            return None

    sys.meta_path.insert(0, Refuse())
    failed = {}
    for name in sys.argv[2].split(","):
        try:
            importlib.import_module(name)
        except ImportError as e:
            failed[name] = str(e)
    print(json.dumps(failed))
    """
)


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "torch_modules", REPO / "deploy" / "image" / "torch_modules.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_product_leaves_out_the_trainer_integrations_only() -> None:
    # The controller needs no framework: it leaves out nothing of its own.
    assert load().torch_modules(REPO, ["reclaimd", "handlers"]) == []
    # The SDK it carries for the contract (times, share, request) leaves out its integrations.
    assert set(load().torch_modules(REPO, ["reclaimd_trainer"])) == {
        "reclaimd_trainer/torch.py",
        "reclaimd_trainer/routine.py",
        "reclaimd_trainer/lightning.py",
        "reclaimd_trainer/hf.py",
    }


def test_the_rig_leaves_out_the_torch_jobs() -> None:
    found: list[str] = load().torch_modules(REPO, ["chaos"])
    assert set(found) == {"chaos/torchjob.py", "chaos/lightningjob.py", "chaos/bench/trainer.py"}


def test_relative_and_guarded_imports() -> None:
    m = load()
    source = textwrap.dedent(
        """
        from typing import TYPE_CHECKING
        from . import fleet
        from .scenario import Plan
        if TYPE_CHECKING:
            import torch
        try:
            import lightning
        except ImportError:
            lightning = None
        def later():
            import transformers
        """
    )
    found = m.imports_at_import_time(source, "chaos.drill.run", is_package=False)
    assert {"chaos.drill.fleet", "chaos.drill.scenario", "typing"} <= found
    assert not {f.split(".")[0] for f in found} & set(FRAMEWORKS)


def test_left_out_means_cannot_import_without_a_framework_and_the_rest_imports() -> None:
    m = load()
    left_out = set(m.torch_modules(REPO))
    names = sorted(
        m.module_name(REPO, p)
        for top in ("reclaimd", "reclaimd_trainer", "handlers", "chaos")
        for p in (REPO / top).rglob("*.py")
        if "__pycache__" not in p.parts
    )
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, ",".join(FRAMEWORKS), ",".join(names)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    by_path = {m.module_name(REPO, REPO / p): p for p in left_out}
    assert set(failed) == set(by_path), failed


def test_import_all_names_each_module_that_fails(tmp_path: Path) -> None:
    pkg = tmp_path / "shipped"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ok.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("import torch_that_is_not_there\n")
    (pkg / "bad.py").write_text("raise RuntimeError('at import')\n")
    done = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "image" / "import_all.py"), "shipped"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 1
    failed = sorted(ln.split(":")[1].strip() for ln in done.stderr.splitlines())
    assert failed == ["shipped.bad", "shipped.sub"]
    assert "2 of 4 modules of shipped" in done.stdout
