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


MODELS = settings_models()


def test_the_walk_finds_the_models() -> None:
    assert len(MODELS) >= 10, sorted(MODELS)


@pytest.mark.parametrize("dotted", sorted(MODELS))
def test_every_settings_model_is_a_section_of_the_config_file(dotted: str) -> None:
    assert not unreachable({dotted: MODELS[dotted]}, config.Settings)


def test_no_settings_class_outside_the_models() -> None:
    classes = _own_classes(_modules(reclaimd, "reclaimd."))
    assert not stray_settings(classes), "mirror settings classes: use reclaimd.settings"


def test_the_ledger_writer_takes_its_section_as_it_is() -> None:
    """No keyword of its own mirrors ``ledger.writer`` (a default written twice)."""
    from reclaimd.ledger.writer import LedgerWriter
    from reclaimd.settings.ledger import LedgerWriterSettings

    params = inspect.signature(LedgerWriter.__init__).parameters
    assert params["tuning"].default == config.Settings().ledger.writer
    assert not set(params) & set(LedgerWriterSettings.model_fields)


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
