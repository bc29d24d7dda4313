"""A tiny evaluator for the subset of the Cloud Logging query language deploy/gcp's sink filter
uses: ``field.path="string"``, ``AND``, ``OR`` and parentheses. No emulator exists for Cloud
Logging, so this is how the filter's field conditions meet the sample LogEntries.

Precedence follows the Logging query language: ``OR`` binds tighter than ``AND``
(``a AND b OR c`` is ``a AND (b OR c)``). Anything outside the subset (``NOT``, ``:``, ``>``,
implicit AND between adjacent terms, unquoted values) is a ``ValueError``, so a filter that grows
beyond what is evaluated here fails the test instead of being half-checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]

_TOKEN = re.compile(r'\s*(?:(\()|(\))|(AND|OR)\b|([A-Za-z_@][\w.@]*)\s*=\s*"((?:[^"\\]|\\.)*)")')


def _tokens(text: str) -> list[tuple[str, str, str]]:
    """(kind, field, value) triples: kind is ``(``, ``)``, ``AND``, ``OR`` or ``=``."""
    out: list[tuple[str, str, str]] = []
    pos, end = 0, len(text.rstrip())
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"unsupported filter syntax at {text[pos : pos + 30]!r}")
        opening, closing, op, field, value = m.groups()
        if opening or closing:
            out.append((opening or closing, "", ""))
        elif op:
            out.append((op, "", ""))
        else:
            out.append(("=", field, re.sub(r"\\(.)", r"\1", value)))
        pos = m.end()
    return out


def _field(entry: Mapping[str, Any], path: str) -> Any:
    node: Any = entry
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


class _Parser:
    def __init__(self, tokens: list[tuple[str, str, str]]) -> None:
        self.tokens, self.i = tokens, 0

    def peek(self) -> str:
        return self.tokens[self.i][0] if self.i < len(self.tokens) else ""

    def take(self, kind: str) -> tuple[str, str, str]:
        if self.peek() != kind:
            raise ValueError(f"expected {kind!r}, found {self.peek() or 'end'!r}")
        self.i += 1
        return self.tokens[self.i - 1]

    def conjunction(self) -> Predicate:
        terms = [self.disjunction()]
        while self.peek() == "AND":
            self.take("AND")
            terms.append(self.disjunction())
        return lambda e: all(t(e) for t in terms)

    def disjunction(self) -> Predicate:
        terms = [self.term()]
        while self.peek() == "OR":
            self.take("OR")
            terms.append(self.term())
        return lambda e: any(t(e) for t in terms)

    def term(self) -> Predicate:
        if self.peek() == "(":
            self.take("(")
            inner = self.conjunction()
            self.take(")")
            return inner
        _, field, value = self.take("=")
        return lambda e: _field(e, field) == value


def compile_filter(text: str) -> Predicate:
    parser = _Parser(_tokens(text))
    predicate = parser.conjunction()
    if parser.peek():
        raise ValueError(f"unexpected {parser.peek()!r} (implicit AND is not supported)")
    return predicate
