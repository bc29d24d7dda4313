"""Every setting that exists in the code can be set from the config file.

The test walks the package for settings dataclasses (``*Settings``) and checks the tunable
constructors named in ``config.CODE_SETTINGS``: each field must be a same-named field of its
config section (with the same default, unless the difference is declared), or be declared as
set from another config path, or as discovered at run time. A setting added to the code
without a way to set it fails here.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

import reclaimd
from reclaimd import config

# Named in CODE_SETTINGS before the code has it (the lead adds the checkpoint settings object);
# once it exists it is checked like every other.
PENDING = {"reclaimd.checkpoint.CheckpointSettings"}
SKIPPED_PACKAGES = ("chaos", "chaos.bench.latency")  # drills and benches: not the daemon


def _modules() -> list[Any]:
    found = []
    for info in pkgutil.walk_packages(reclaimd.__path__, "reclaimd."):
        if not info.name.startswith(SKIPPED_PACKAGES):
            found.append(importlib.import_module(info.name))
    return found


def _settings_dataclasses() -> dict[str, type]:
    found: dict[str, type] = {}
    for module in _modules():
        for name, obj in vars(module).items():
            own = getattr(obj, "__module__", None) == module.__name__
            is_class = own and inspect.isclass(obj) and dataclasses.is_dataclass(obj)
            if is_class and name.endswith("Settings"):
                found[f"{module.__name__}.{name}"] = obj
    return found


def _resolve(dotted: str) -> type | None:
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def _section(path: str) -> type[BaseModel]:
    model: type[BaseModel] = config.Settings
    for part in filter(None, path.split(".")):
        annotation = model.model_fields[part].annotation
        assert inspect.isclass(annotation) and issubclass(annotation, BaseModel), path
        model = annotation
    return model


def _config_path_exists(path: str) -> bool:
    head, _, last = path.rpartition(".")
    try:
        return last in _section(head).model_fields
    except (KeyError, AssertionError):
        return False


def _code_fields(cls: type) -> dict[str, Any]:
    """Field name -> default (``inspect.Parameter.empty`` when there is none)."""
    if dataclasses.is_dataclass(cls):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
            else:
                out[f.name] = inspect.Parameter.empty
        return out
    # A tunable constructor: its keyword arguments with plain-value defaults (None and
    # callables are wiring, not settings).
    params = inspect.signature(cls.__init__).parameters.values()
    plain = (bool, int, float, str, timedelta)
    return {p.name: p.default for p in params if isinstance(p.default, plain)}


def _problems(dotted: str, cls: type, part: config.CodePart) -> list[str]:
    problems: list[str] = []
    section = _section(part.section)
    code = _code_fields(cls)
    for name, default in code.items():
        if name in part.elsewhere:
            source = part.elsewhere[name]
            if not source.startswith("discovered:") and not _config_path_exists(source):
                problems.append(f"{dotted}.{name}: set from {source!r}, which is no setting")
            continue
        if name not in section.model_fields:
            where = part.section or "the top level"
            problems.append(f"{dotted}.{name}: no config field of that name in {where}")
            continue
        if default is inspect.Parameter.empty or name in part.defaults_differ:
            continue
        ours = section.model_fields[name].get_default(call_default_factory=True)
        if isinstance(ours, BaseModel):
            continue  # a nested section: its own entry checks its fields
        theirs = default.total_seconds() if isinstance(default, timedelta) else default
        if ours != theirs:
            problems.append(f"{dotted}.{name}: config default {ours!r}, code default {theirs!r}")
    return problems


def test_every_settings_dataclass_has_a_config_entry() -> None:
    missing = sorted(set(_settings_dataclasses()) - set(config.CODE_SETTINGS))
    assert not missing, (
        f"settings with no config path (add them to config.CODE_SETTINGS): {missing}"
    )


def test_every_entry_names_code_that_exists() -> None:
    absent = {d for d in config.CODE_SETTINGS if _resolve(d) is None}
    assert absent <= PENDING, f"CODE_SETTINGS names code that does not exist: {absent - PENDING}"


@pytest.mark.parametrize("dotted", sorted(config.CODE_SETTINGS))
def test_every_field_is_reachable_from_the_config_file(dotted: str) -> None:
    cls = _resolve(dotted)
    if cls is None:
        assert dotted in PENDING
        return
    assert not _problems(dotted, cls, config.CODE_SETTINGS[dotted])


def test_the_walk_can_fail() -> None:
    @dataclasses.dataclass(frozen=True)
    class NewSettings:
        page_size: int = 250
        brand_new_s: float = 1.0
        inactivity_timeout_s: float = 1.0  # a default that drifted

    problems = _problems("x.NewSettings", NewSettings, config.CodePart("cache.watch"))
    assert problems == [
        "x.NewSettings.brand_new_s: no config field of that name in cache.watch",
        "x.NewSettings.inactivity_timeout_s: config default 70.0, code default 1.0",
    ]
    moved = config.CodePart("cache.watch", {"brand_new_s": "cache.nowhere"})
    assert _problems("x.NewSettings", NewSettings, moved)[0].endswith("which is no setting")
