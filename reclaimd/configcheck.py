"""Every error of a settings file at once, one line each, saying where and what to do.

``reclaimd.config.load`` validates the file with its ``RECLAIMD_*`` overrides; what fails is
reported here: each line names the file and the key's dotted path (``c.yaml: sqs.wait_time_s:
...``), or, when the value came from the environment, the variable (``RECLAIMD_SQS__WAIT_TIME_S
(sqs.wait_time_s): ...``). An unknown key gets a "did you mean" from the keys of its section.
Then what an enabled source lacks to hear anything (its settings model says: ``needs``), and,
for ``check-config``, a file that enables no source at all.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from reclaimd import handlers

Path_ = tuple[str, ...]


class Where:
    """Names the origin of a key: the file, or the ``RECLAIMD_*`` variable that set it."""

    def __init__(self, file: str | None, origins: Mapping[Path_, str]) -> None:
        self.file, self.origins = file, origins

    def variable(self, loc: Path_) -> str | None:
        for path, variable in self.origins.items():
            if loc[: len(path)] == path:
                return variable
        return None

    def line(self, loc: Path_, message: str) -> str:
        key = ".".join(loc)
        variable = self.variable(loc) if loc else None
        if variable is not None:
            return f"{variable} ({key}): {message}"
        at = f"{self.file}: " if self.file else ""
        return f"{at}{key}: {message}" if key else f"{at}{message}"


def _keys_at(defaults: Any, loc: Path_) -> list[str]:
    """The keys a section at ``loc`` has (from the settings' defaults, dumped)."""
    node = defaults
    for part in loc:
        if not isinstance(node, dict) or part not in node:
            return []
        node = node[part]
    return sorted(node) if isinstance(node, dict) else []


def unknown_key(loc: Path_, defaults: Mapping[str, Any]) -> str:
    """What to say of a key no section has: the nearest real one, else the section's keys."""
    keys = _keys_at(dict(defaults), loc[:-1])
    close = difflib.get_close_matches(loc[-1], keys, n=1, cutoff=0.6)
    if close:
        return f"not a setting: did you mean {'.'.join((*loc[:-1], close[0]))}?"
    if keys:
        shown = ", ".join(keys[:12]) + (", ..." if len(keys) > 12 else "")
        return f"not a setting: remove it (the keys here: {shown})"
    return "not a setting: remove it"


# pydantic's words where they name a Python type rather than what to write.
_SAYS = {
    "model_type": "a section: write its keys under it (key: value), or leave it out",
    "dict_type": "a section: write its keys under it (key: value), or leave it out",
    "tuple_type": "a list: write [a, b] or one '- item' line each",
    "list_type": "a list: write [a, b] or one '- item' line each",
    "bool_parsing": "write true or false",
    "bool_type": "write true or false",
}


def validation_lines(e: ValidationError, model: type[BaseModel], where: Where) -> list[str]:
    """One line per error of ``e``, in the file's terms."""
    defaults: dict[str, Any] | None = None
    out = []
    for error in e.errors():
        loc = tuple(str(p) for p in error["loc"])
        if error["type"] == "extra_forbidden":
            if defaults is None:
                defaults = model().model_dump(mode="json")
            message = unknown_key(loc, defaults)
        elif error["type"] in _SAYS:
            message = _SAYS[error["type"]]
        else:
            message = " ".join(str(error["msg"]).split())  # a validator's words stay one line
            message = message.removeprefix("Value error, ")  # pydantic's wrapping of ours
        out.append(where.line(loc, message))
    return out


def source_lines(data: Mapping[str, Any], where: Where, *, require_source: bool) -> list[str]:
    """What each enabled source lacks (each section validated alone: a section with errors of
    its own was reported already), and, with ``require_source``, that none is enabled."""
    out, enabled = [], []
    for entry in handlers.REGISTRY:
        raw = data.get(entry.name, {})
        try:
            section = entry.model.model_validate(raw)
        except ValidationError:
            enabled.append(entry.name)  # reported already; whether it is enabled, unknown
            continue
        if not section.enabled:
            continue
        enabled.append(entry.name)
        by = where.variable((entry.name, "enabled"))
        because = f" (enabled by {by})" if by else ""
        for key, message in section.needs().items():
            out.append(where.line((entry.name, key), message) + because)
    if require_source and not enabled and not out:
        names = ", ".join(e.name for e in handlers.REGISTRY)
        at = f"{where.file}: " if where.file else ""
        out.append(
            f"{at}no source is enabled, so this replica would hear no notice:"
            f" set enabled: true under one of {names}"
        )
    return out
