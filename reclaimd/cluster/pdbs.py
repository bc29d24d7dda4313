"""PodDisruptionBudgets as the cache sees them: which cover a pod, and a wake-up on a change.

An eviction a PDB refuses (429) is refused again until the budget's status changes, and the
disruption controller changes it when a covered pod goes, turns ready or is added. So a
refused eviction is tried again when a PDB covering its pod changes, not on a timer: in a
storm, a budget that never opens (bare pods under ``maxUnavailable``) costs one eviction
request and the forced delete, not one request every few seconds until the deadline, and the
write budget those requests took goes to other notices' cordons and evictions.

Only the selector is kept of each PDB: the status is the API server's to judge (its
unhealthy-pod policy makes "disruptionsAllowed: 0" not always a refusal), we only learn from
the watch that it may have changed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

PdbId = tuple[str, str]  # namespace, name


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        return False  # an operator the API server would have rejected: match nothing


@dataclass(frozen=True, slots=True)
class Selector:
    """A ``metav1.LabelSelector``; ``None`` for a PDB without one (it selects no pod)."""

    labels: tuple[tuple[str, str], ...]
    expressions: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.labels) and all(
            r.matches(labels) for r in self.expressions
        )

    def pins(self, key: str, value: str) -> bool:
        """Every pod it selects has ``key=value``."""
        return (key, value) in self.labels or any(
            r.key == key and r.operator == "In" and r.values == {value} for r in self.expressions
        )


def selector_of(raw: Any) -> Selector | None:
    """policy/v1: a null selector selects nothing, an empty one every pod of the namespace."""
    if not isinstance(raw, Mapping):
        return None
    match = raw.get("matchLabels") or {}
    expressions = raw.get("matchExpressions") or ()
    return Selector(
        labels=tuple(sorted((str(k), str(v)) for k, v in match.items())),
        expressions=tuple(
            Requirement(
                str(e.get("key") or ""),
                str(e.get("operator") or ""),
                frozenset(str(v) for v in e.get("values") or ()),
            )
            for e in expressions
            if isinstance(e, Mapping)
        ),
    )


def pdb_id(obj: Mapping[str, Any]) -> PdbId:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class PdbIndex:
    """The selectors of every watched PDB, and the evictions waiting for one to change.

    Updated synchronously on the event loop by the cache's watch (``replace``/``put``/
    ``drop``); ``watching`` hands an eviction an ``asyncio.Event`` set on the next change of
    a PDB covering its pod (of any PDB in the namespace when none is known to cover it:
    the cache may not have seen the PDB yet).
    """

    def __init__(self) -> None:
        self._selectors: dict[PdbId, Selector | None] = {}
        self._waiters: defaultdict[PdbId, set[asyncio.Event]] = defaultdict(set)
        self._namespace_waiters: defaultdict[str, set[asyncio.Event]] = defaultdict(set)

    def __len__(self) -> int:
        return len(self._selectors)

    def replace(self, namespace: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """A LIST: what the watch missed may have changed anything in ``namespace``
        (every namespace when it is "")."""
        for pid in [p for p in self._selectors if not namespace or p[0] == namespace]:
            del self._selectors[pid]
        for obj in objects:
            self._selectors[pdb_id(obj)] = selector_of((obj.get("spec") or {}).get("selector"))
        for pid in [p for p in self._waiters if not namespace or p[0] == namespace]:
            self._wake(self._waiters.pop(pid))
        for ns in [n for n in self._namespace_waiters if not namespace or n == namespace]:
            self._wake(self._namespace_waiters.pop(ns))

    def put(self, obj: Mapping[str, Any]) -> None:
        pid = pdb_id(obj)
        self._selectors[pid] = selector_of((obj.get("spec") or {}).get("selector"))
        self._changed(pid)

    def drop(self, obj: Mapping[str, Any]) -> None:
        pid = pdb_id(obj)
        self._selectors.pop(pid, None)
        self._changed(pid)

    def covering(self, namespace: str, labels: Mapping[str, str]) -> list[str]:
        """The names of the PDBs whose selector matches a pod with ``labels``."""
        return sorted(
            name
            for (ns, name), selector in self._selectors.items()
            if ns == namespace and selector is not None and selector.matches(labels)
        )

    def guards_only(
        self, namespace: str, labels: Mapping[str, str], identity: Iterable[tuple[str, str]]
    ) -> bool:
        """Some PDB covers the pod, and every one that does selects only pods with all of
        ``identity`` (``gangs.identity_labels``: its own gang's). False with no identity."""
        pinned = tuple(identity)
        covering = [
            selector
            for (ns, _), selector in self._selectors.items()
            if ns == namespace and selector is not None and selector.matches(labels)
        ]
        return bool(pinned and covering) and all(
            all(selector.pins(k, v) for k, v in pinned) for selector in covering
        )

    @contextlib.contextmanager
    def watching(self, namespace: str, labels: Mapping[str, str]) -> Iterator[asyncio.Event]:
        """An event set when a PDB covering the pod changes; enter it before the eviction is
        sent, so a change while the request is in flight is not missed."""
        event = asyncio.Event()
        names = self.covering(namespace, labels)
        if names:
            for name in names:
                self._waiters[(namespace, name)].add(event)
        else:
            self._namespace_waiters[namespace].add(event)
        try:
            yield event
        finally:
            for name in names:
                _discard(self._waiters, (namespace, name), event)
            _discard(self._namespace_waiters, namespace, event)

    def _changed(self, pid: PdbId) -> None:
        self._wake(self._waiters.pop(pid, set()))
        self._wake(self._namespace_waiters.pop(pid[0], set()))

    @staticmethod
    def _wake(events: Iterable[asyncio.Event]) -> None:
        for event in events:
            event.set()


def _discard(index: defaultdict[Any, set[asyncio.Event]], key: Any, event: asyncio.Event) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(event)
        if not members:
            del index[key]
