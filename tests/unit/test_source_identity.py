"""A source is one folder: its identity lives in handlers/<name>/ (its ENTRY, parser,
settings and transport), and everything else is derived from ``REGISTRY`` (pure: reads the
checkout).

The proof lists, for each source, the product files whose code names it: its name (the
folder, settings section, task and metrics label), its aliases (its parser's former name) and
the ``Notice.source`` values under its origin prefix. Code means identifiers and string
literals; docstrings and comments are documentation and may name anything.

The direction of the imports is proven too: the registry imports every folder's entry, and no
parser imports the registry or any reclaimd module but the model and the shared readers.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import re
import sys
import tomllib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from reclaimd import config, handlers
from reclaimd.handlers.entry import Entry, Origin, SourceSettings
from reclaimd.handlers.sqs.parser import AsgLifecycleFacts
from reclaimd.model import (
    Cause,
    Facts,
    Ignored,
    Notice,
    NoticeKind,
    ParseOutcome,
    Placement,
    Target,
    TraceContext,
    Windows,
    frozen_map,
    utcnow,
)

REPO = Path(__file__).resolve().parents[2]
HANDLERS = REPO / "handlers"
CHART = REPO / "deploy" / "helm" / "reclaimd"
PRODUCT = ("reclaimd", "handlers")
API_GROUP = re.compile(r"[\w.-]*\.x-k8s\.io")
# A Kubernetes API group, label or annotation key in a template (iam.gke.io/...): a cloud's
# or an API's name, not a source's.
KUBE_KEY = re.compile(r"[\w.-]+\.io\b[\w./-]*")

# Where an existing source's name means something else, and why: the proof holds for these
# files only because the word is another thing's name there.
OTHER_MEANINGS: dict[str, dict[str, str]] = {
    "kueue": {
        # A gang's kind: Kueue the gang framework, whatever sources run.
        "reclaimd/cluster/gangs.py": "kind kueue",
    },
    "kafka_notices": {
        # Its parser is named for the wire; so is the ledger's topic and the client's logger.
        "reclaimd/logs.py": "the kafka client's logger",
        "reclaimd/runbookspans.py": "the ledger's messaging.system",
        "reclaimd/report/ledger_input.py": "kafka://, where a report reads the ledger topic",
        # The kafka settings section: how every Kafka client connects (TLS, SASL), the
        # ledger's broker as much as the notices'.
        "reclaimd/config.py": "the kafka section (reclaimd.kafkaconn)",
        "reclaimd/wiring.py": "the ledger writers' connection, the kafka section, and the "
        "readiness check named kafka: the ledger's broker refuses us",
        "reclaimd/cli.py": "check-config prints the kafka section's shape",
    },
}
# An existing source's own module outside its folder, and why.
OWN_MODULES: dict[str, dict[str, str]] = {
    "pubsub": {
        "reclaimd/cluster/slots.py": "its slot Leases (reclaimd-pubsub-slot-*), written "
        "through the cluster's write budget and read by reclaimd status and the rig's teardown",
    },
}


def load_gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_sources", CHART.parent / "gen_sources.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_sources", module)
    spec.loader.exec_module(module)
    return module


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def code_tokens(path: Path) -> Iterator[str]:
    """Identifiers and string literals of a module, docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    for node in ast.walk(tree):
        match node:
            case ast.Constant(value=str(text)) if id(node) not in docs:
                yield text
            case ast.Name(id=name) | ast.Attribute(attr=name) | ast.arg(arg=name):
                yield name
            case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
                yield name
            case ast.ClassDef(name=name) | ast.keyword(arg=str(name)):
                yield name
            case ast.alias(name=name, asname=asname):
                yield name
                if asname:
                    yield asname
            case ast.ImportFrom(module=str(name)):
                yield name


def owner_of_prefix(text: str, registry: tuple[Entry[Any], ...]) -> str | None:
    """The entry whose origin prefix ``text`` starts with (the longest), if any."""
    best: Entry[Any] | None = None
    for entry in registry:
        prefix = entry.origin.prefix
        if (
            prefix
            and text.startswith(prefix)
            and (best is None or len(prefix) > len(best.origin.prefix))
        ):
            best = entry
    return best.name if best is not None else None


def names(entry: Entry[Any], text: str, registry: tuple[Entry[Any], ...]) -> bool:
    """Whether one token of code names ``entry``."""
    if API_GROUP.search(text):
        return False  # kueue.x-k8s.io/...: a Kubernetes API group or label key, not a source
    if re.search(rf"(?<![A-Za-z0-9]){re.escape(entry.name)}(?![A-Za-z0-9])", text):
        return True
    if text in entry.aliases:
        return True
    return owner_of_prefix(text, registry) == entry.name


def product_files() -> list[Path]:
    return sorted(p for top in PRODUCT for p in (REPO / top).rglob("*.py"))


def module_file(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    return rel(Path(spec.origin).resolve())  # reclaimd/handlers is a symlink to handlers/


def folder(entry: Entry[Any]) -> Path:
    return HANDLERS / entry.name


def own_files(entry: Entry[Any]) -> set[str]:
    """Its folder's modules (entry, parser, settings, transport, what only it owns)."""
    files = {rel(p) for p in folder(entry).rglob("*.py")}
    return files | set(OWN_MODULES.get(entry.name, {}))


@pytest.fixture(scope="module")
def tokens() -> dict[str, set[str]]:
    return {rel(p): set(code_tokens(p)) for p in product_files()}


@pytest.mark.parametrize("entry", handlers.REGISTRY, ids=lambda e: e.name)
def test_a_sources_name_is_in_its_folder_only(
    entry: Entry[Any], tokens: dict[str, set[str]]
) -> None:
    found = {
        path
        for path, toks in tokens.items()
        if any(names(entry, t, handlers.REGISTRY) for t in toks)
    }
    found -= set(OTHER_MEANINGS.get(entry.name, {}))
    assert found <= own_files(entry)
    # ... and the scan sees it where it is: in its folder's entry at least.
    assert rel(folder(entry) / "__init__.py") in found
    # Its folder is where the registry found it, and holds its parser and transport.
    assert module_file(entry.parse.__module__) in own_files(entry)
    assert module_file(entry.module) in own_files(entry)
    if entry.after_drain:
        assert module_file(f"{entry.package}.{entry.after_drain}") in own_files(entry)


def test_the_proof_sees_a_name_where_code_uses_it(tmp_path: Path) -> None:
    """The scan is no blind eye: a stray use of a name in code is found, a docstring is not."""
    stray = tmp_path / "stray.py"
    stray.write_text('"""sqs, imds, gce-metadata in a docstring."""\nX = settings.imds\n')
    (imds,) = [e for e in handlers.REGISTRY if e.name == "imds"]
    (sqs,) = [e for e in handlers.REGISTRY if e.name == "sqs"]
    toks = set(code_tokens(stray))
    assert any(names(imds, t, handlers.REGISTRY) for t in toks)
    assert not any(names(sqs, t, handlers.REGISTRY) for t in toks)
    assert owner_of_prefix("aws.imds.spot", handlers.REGISTRY) == "imds"
    assert owner_of_prefix("aws.ec2.spot", handlers.REGISTRY) == "sqs"


def test_the_exceptions_are_still_needed(tokens: dict[str, set[str]]) -> None:
    """An exception the code no longer needs goes (else it would hide a real use later)."""
    for name, files in (OTHER_MEANINGS | OWN_MODULES).items():
        entry = handlers.BY_NAME[name]
        for path in files:
            assert any(names(entry, t, handlers.REGISTRY) for t in tokens[path]), (name, path)


def test_the_chart_templates_name_no_source() -> None:
    template_comment = re.compile(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", re.S)
    yaml_comment = re.compile(r"^\s*#.*$", re.M)
    # A source's name anywhere; its parser's or agent's only quoted (kafka is also the
    # ledger's broker, $np.kafka).
    words = "|".join(re.escape(e.name) for e in handlers.REGISTRY)
    quoted = "|".join(
        re.escape(f'"{v}"') for e in handlers.REGISTRY for v in (*e.aliases, e.agent) if v
    )
    pattern = re.compile(rf"(?<![A-Za-z0-9_-])({words})(?![A-Za-z0-9_])|{quoted}")
    for template in sorted((CHART / "templates").iterdir()):
        text = template.read_text(encoding="utf-8")
        code = KUBE_KEY.sub("", yaml_comment.sub("", template_comment.sub("", text)))
        assert pattern.findall(code) == [], template.name


def test_the_import_contracts_name_no_source() -> None:
    linter = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    text = json.dumps(linter)
    modules = {e.module for e in handlers.REGISTRY} | {e.package for e in handlers.REGISTRY}
    modules |= {e.parse.__module__ for e in handlers.REGISTRY}
    for module in sorted(modules):
        assert f'"{module}' not in text, module
    assert "reclaimd.handlers.*" in text and "reclaimd.handlers.*.transport" in text


def test_the_charts_source_files_are_the_registrys() -> None:
    gen = load_gen()
    for path, text in gen.generated().items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{rel(path)}: run deploy/helm/gen_sources.py"
        )


def test_every_folder_is_a_source_and_every_source_a_folder() -> None:
    assert sorted(e.name for e in handlers.REGISTRY) == sorted(handlers.PARSERS)
    folders = {p.parent.name for p in HANDLERS.glob("*/__init__.py")}
    assert folders == set(handlers.BY_NAME)


# --- parsers import only the model ------------------------------------------------------------

# The shared readers a parser may import beside the model.
READERS = ("base", "fields", "ids", "targets")


def reclaimd_imports(path: Path) -> set[str]:
    """The reclaimd modules a module's import statements name, lazy ones in functions too
    (``from reclaimd.handlers import ids`` names ``reclaimd.handlers.ids``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        match node:
            case ast.Import(names=aliases):
                found |= {alias.name for alias in aliases}
            case ast.ImportFrom(module="reclaimd" | "reclaimd.handlers" as pkg, level=0):
                found |= {f"{pkg}.{alias.name}" for alias in node.names}
            case ast.ImportFrom(module=str(module), level=0):
                found.add(module)
    return {m for m in found if m == "reclaimd" or m.startswith("reclaimd.")}


def beyond_the_model(path: Path) -> set[str]:
    allowed = {"reclaimd.model", *(f"reclaimd.handlers.{r}" for r in READERS)}
    return {m for m in reclaimd_imports(path) if m not in allowed}


def test_parsers_import_no_reclaimd_module_but_the_model() -> None:
    """The registry imports every folder's parser; a parser importing it back (or any other
    reclaimd module but the shared readers) makes a parser depend on what is built from
    parsers."""
    paths = [*HANDLERS.glob("*/parser.py"), *(HANDLERS / f"{r}.py" for r in READERS)]
    found = {rel(p): beyond_the_model(p) for p in sorted(paths)}
    assert len(found) == len(handlers.REGISTRY) + len(READERS)  # the scan sees every parser
    assert {path: mods for path, mods in found.items() if mods} == {}


def test_the_import_scan_sees_a_back_import(tmp_path: Path) -> None:
    stray = tmp_path / "stray.py"
    stray.write_text(
        "from reclaimd.model import Facts\n"
        "from reclaimd.handlers.entry import Entry\n"
        "from reclaimd.handlers import ids, running\n"
        "def f():\n"
        "    from reclaimd import model, handlers\n"
        "    import reclaimd.config\n"
    )
    assert beyond_the_model(stray) == {
        "reclaimd.handlers.entry", "reclaimd.handlers.running", "reclaimd.handlers",
        "reclaimd.config",
    }


@pytest.mark.parametrize("entry", handlers.REGISTRY, ids=lambda e: e.name)
def test_a_sources_own_facts_are_its_parsers(entry: Entry[Any]) -> None:
    assert {kind.__module__ for kind in entry.facts} <= {entry.parse.__module__}


# --- a seventh source, as one entry -----------------------------------------------------------


class SeventhSettings(SourceSettings):
    url: str = "http://169.254.169.254"
    node_name: str = ""


def parse_seventh(payload: bytes, *, received_at: datetime, windows: Windows) -> ParseOutcome:
    return Ignored("a seventh source's payload")


SEVENTH = Entry(
    "seventh",
    SeventhSettings,
    Origin("cloud7.", "cloud7", "cloud7_vm", transport="seventh"),
    parse=parse_seventh,
    agent="seventh",
    agent_node_name=True,
    aliases=("seventh-parser",),
    order=99,
)
WITH_SEVENTH = (*handlers.REGISTRY, SEVENTH)


def test_a_new_entry_is_a_settings_section_with_its_model() -> None:
    model = config.settings_model(WITH_SEVENTH)
    s = model.model_validate({"seventh": {"enabled": True, "url": "http://127.0.0.1:1"}})
    assert SEVENTH.enabled(s) and SEVENTH.section(s).url == "http://127.0.0.1:1"
    assert [e.name for e in handlers.REGISTRY if e.enabled(s)] == []
    assert model.model_validate({}).seventh == SeventhSettings()
    assert "seventh" not in config.Settings.model_fields  # the real one has the real six


def test_a_new_entry_is_in_the_charts_sources_and_agent_enum() -> None:
    gen = load_gen()
    doc = gen.sources_doc(WITH_SEVENTH)
    assert doc["sources"][-1] == "seventh"
    assert doc["agents"]["seventh"] == {"section": "seventh", "nodeName": True}
    schema = json.loads((CHART / "values.schema.json").read_text())
    enum = gen.schema_doc(schema, WITH_SEVENTH)["properties"]["nodeAgent"]["properties"]["source"]
    assert enum["enum"][-1] == "seventh"


# --- typed facts ------------------------------------------------------------------------------


def test_no_two_kinds_of_facts_share_a_key() -> None:
    """A fact is one field of one kind: a source's own never reuse another's or the model's."""
    kinds: list[type[Facts]] = [Placement, Cause, TraceContext]
    kinds += [kind for entry in handlers.REGISTRY for kind in entry.facts]
    keys = [f.name for kind in kinds for f in dataclasses.fields(kind)]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


def test_facts_are_attributes_on_the_wire_and_fields_when_read() -> None:
    facts = AsgLifecycleFacts(asg_name="my-asg", lifecycle_action_token="t")
    assert facts.attributes() == {"asg_name": "my-asg", "lifecycle_action_token": "t"}
    notice = Notice(
        id="n",
        source="aws.autoscaling",
        kind=NoticeKind.SCHEDULED_CHANGE,
        target=Target(instance_id="i-0abc"),
        issued_at=utcnow(),
        deadline=None,
        received_at=utcnow(),
        attributes=frozen_map({**facts.attributes(), **Placement(region="r").attributes()}),
    )
    again = Notice.from_json(json.loads(json.dumps(notice.to_json())))
    assert AsgLifecycleFacts.of(again) == facts
    assert Placement.of(again) == Placement(region="r")
    assert TraceContext.of(again) == TraceContext()
