"""Every setting that exists in the code can be set from the config file.

The code takes its settings models (``reclaimd.settings``) as they are, so a model is
reachable when ``Settings`` holds it as a section (at any depth). The test walks the package:
a settings model no section holds, or a ``*Settings`` class outside ``reclaimd.settings``
(a second layer, mirrored by hand), fails here. Constructors still tuned by keyword take
their values from a section whose fields share the names: their defaults must be the
section's, or the code and a deployment disagree unseen.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from typing import Any, get_args

import pytest
from pydantic import BaseModel

import reclaimd
import reclaimd.settings
from reclaimd import config
from reclaimd.strict import Strict

SKIPPED_PACKAGES = ("chaos",)  # drills and benches: not the daemon
# Constructors tuned by keyword arguments, the section their values come from (``""``: the
# top level) and the names that differ there.
TUNED: dict[str, tuple[str, dict[str, str]]] = {
    "reclaimd.ledger.writer.LedgerWriter": ("ledger.writer", {}),
}


def _modules(package: Any, prefix: str) -> list[Any]:
    found = [package]
    for info in pkgutil.walk_packages(package.__path__, prefix):
        if not info.name.startswith(SKIPPED_PACKAGES):
            found.append(importlib.import_module(info.name))
    return found


def _own_classes(modules: list[Any]) -> dict[str, type]:
    return {
        f"{m.__name__}.{name}": obj
        for m in modules
        for name, obj in vars(m).items()
        if inspect.isclass(obj) and getattr(obj, "__module__", None) == m.__name__
    }


def settings_models() -> dict[str, type[BaseModel]]:
    classes = _own_classes(_modules(reclaimd.settings, "reclaimd.settings."))
    return {k: c for k, c in classes.items() if issubclass(c, Strict)}


def _sections(model: type[BaseModel]) -> set[type[BaseModel]]:
    """Every model ``model`` holds as a section, at any depth (itself included)."""
    found = {model}
    for f in model.model_fields.values():
        for t in (f.annotation, *get_args(f.annotation)):
            if inspect.isclass(t) and issubclass(t, BaseModel) and t not in found:
                found |= _sections(t)
    return found


def unreachable(models: dict[str, type[BaseModel]], root: type[BaseModel]) -> list[str]:
    held = _sections(root)
    return sorted(name for name, model in models.items() if model not in held)


def stray_settings(classes: dict[str, type]) -> list[str]:
    """``*Settings`` classes of the code that are not settings models: a second layer."""
    return sorted(
        name
        for name, cls in classes.items()
        if name.endswith("Settings")
        and not name.startswith("reclaimd.settings.")
        and (dataclasses.is_dataclass(cls) or not issubclass(cls, BaseModel))
    )


def _section(path: str) -> type[BaseModel]:
    model: type[BaseModel] = config.Settings
    for part in filter(None, path.split(".")):
        annotation = model.model_fields[part].annotation
        assert inspect.isclass(annotation) and issubclass(annotation, BaseModel), path
        model = annotation
    return model


def tuned_problems(dotted: str, cls: type, section_path: str, renamed: dict[str, str]) -> list[str]:
    """A keyword argument with a plain default that its section lacks or sets differently."""
    section = _section(section_path)
    problems = []
    for p in inspect.signature(cls.__init__).parameters.values():
        if not isinstance(p.default, bool | int | float | str):
            continue  # None and callables are wiring, not settings
        name = renamed.get(p.name, p.name)
        if name not in section.model_fields:
            problems.append(f"{dotted}.{p.name}: no config field {name!r} in {section_path!r}")
        elif section.model_fields[name].get_default() != p.default:
            ours = section.model_fields[name].get_default()
            problems.append(f"{dotted}.{p.name}: config default {ours!r}, code {p.default!r}")
    return problems


def _resolve(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    cls: type = getattr(importlib.import_module(module), name)
    return cls


MODELS = settings_models()


def test_the_walk_finds_the_models() -> None:
    assert len(MODELS) >= 10, sorted(MODELS)


@pytest.mark.parametrize("dotted", sorted(MODELS))
def test_every_settings_model_is_a_section_of_the_config_file(dotted: str) -> None:
    assert not unreachable({dotted: MODELS[dotted]}, config.Settings)


def test_no_settings_class_outside_the_models() -> None:
    classes = _own_classes(_modules(reclaimd, "reclaimd."))
    assert not stray_settings(classes), "mirror settings classes: use reclaimd.settings"


@pytest.mark.parametrize("dotted", sorted(TUNED))
def test_every_tuned_keyword_is_reachable_from_the_config_file(dotted: str) -> None:
    section, renamed = TUNED[dotted]
    assert not tuned_problems(dotted, _resolve(dotted), section, renamed)


def test_the_walk_can_fail() -> None:
    class OrphanSettings(Strict):  # a model no section holds
        page_size: int = 250

    @dataclasses.dataclass(frozen=True)
    class MirrorSettings:  # a code dataclass mirroring a section
        page_size: int = 250

    models = {**MODELS, "reclaimd.settings.x.OrphanSettings": OrphanSettings}
    assert unreachable(models, config.Settings) == ["reclaimd.settings.x.OrphanSettings"]
    assert stray_settings({"reclaimd.cluster.x.MirrorSettings": MirrorSettings}) == [
        "reclaimd.cluster.x.MirrorSettings"
    ]

    class Tuned:
        def __init__(self, page_size: int = 250, brand_new_s: float = 1.0) -> None: ...

    class Drifted:
        def __init__(self, inactivity_timeout_s: float = 1.0) -> None: ...

    assert tuned_problems("x.Tuned", Tuned, "cache.watch", {}) == [
        "x.Tuned.brand_new_s: no config field 'brand_new_s' in 'cache.watch'"
    ]
    assert tuned_problems("x.Drifted", Drifted, "cache.watch", {}) == [
        "x.Drifted.inactivity_timeout_s: config default 70.0, code 1.0"
    ]
