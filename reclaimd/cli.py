"""``reclaimd`` command line.

Exit codes: 0 success, 1 a run or drill that did not meet its expectations, 2 bad input
(usage, config, payload). Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from reclaimd import __version__, config
from reclaimd.model import Ignored, ParseError, utcnow

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# Where other distributions add commands (the rig's `reclaimd drill`): an ``add_parser(sub)``.
PLUGIN_GROUP = "reclaimd.cli"


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit 2."""


def _read_input(arg: str) -> bytes:
    if arg == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(arg).read_bytes()
    except OSError as e:
        raise UsageError(f"{arg}: {e.strerror or e}: give a readable file, or - for stdin") from e


def cmd_version(_: argparse.Namespace) -> int:
    print(f"reclaimd {__version__}")
    return EXIT_OK


def cmd_check_config(args: argparse.Namespace) -> int:
    settings = config.load(args.file, require_source=True)
    print(
        f"{args.file}: ok (cluster {settings.cluster_name}, holder {settings.holder},"
        f" kafka {settings.kafka.describe()})"
    )
    return EXIT_OK


def _parse_choices() -> tuple[str, ...]:
    """The sources ``parse --source`` takes: each one's name, and its parser's former name."""
    from reclaimd import handlers

    return handlers.PARSE_CHOICES


def cmd_parse(args: argparse.Namespace) -> int:
    from reclaimd import handlers

    source = handlers.ALIASES.get(args.source, args.source)  # its one name
    if args.vm is not None and source not in handlers.SAVED:
        raise UsageError(
            f"--vm: only with --source {', '.join(sorted(handlers.SAVED))}:"
            f" leave it out for {args.source} (its payload names its instance)"
        )
    windows = config.load(args.config).windows if args.config else config.Settings().windows
    # what people save (a metadata document as the endpoint returns it, for one VM or every
    # VM it names), or the transport's payload
    payload = _read_input(args.file)
    try:
        outcome = handlers.parse_saved(
            source, payload, received_at=utcnow(), windows=windows, target=args.vm or ""
        )
    except ParseError as e:
        if source in handlers.SAVED:
            raise  # a saved body's own errors say what to add
        raise ParseError(
            f"{e}: is it what --source {args.source} reads? Check --source, or give the"
            " message body as it was delivered"
        ) from e
    if isinstance(outcome, Ignored):
        if args.verbose:
            print(f"ignored: {outcome.reason}", file=sys.stderr)
        return EXIT_OK
    for notice in outcome:
        print(json.dumps(notice.to_json(), separators=(",", ":")))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from reclaimd import daemon, logs

    settings = config.load(args.config)
    if args.dry_run:
        settings = settings.model_copy(update={"dry_run": True})
    logs.setup(args.log_level)
    return asyncio.run(daemon.run(settings))


def build_parser(*, tools: bool = True) -> argparse.ArgumentParser:
    """Every command; without ``tools``, none that brings its own modules (the report engine,
    the post-mortem, the drill rig): what ``reclaimd run`` parses with."""
    p = argparse.ArgumentParser(
        prog="reclaimd",
        description="Gang-aware interruption and reclaim controller for GPU Kubernetes fleets.",
    )
    p.add_argument("--version", action="version", version=f"reclaimd {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("version", help="print the version")
    s.set_defaults(func=cmd_version)

    s = sub.add_parser("check-config", help="validate a configuration file (exit 2 if bad)")
    s.add_argument("file")
    s.set_defaults(func=cmd_check_config)

    s = sub.add_parser("parse", help="print the notices a payload yields, one JSON per line")
    s.add_argument("--source", required=True, choices=_parse_choices())
    s.add_argument("file", nargs="?", default="-", help="payload file, or - for stdin")
    s.add_argument("--config", help="settings file (for the notice windows)")
    s.add_argument("-v", "--verbose", action="store_true", help="say why a payload is ignored")
    s.add_argument(
        "--vm",
        metavar="NAME",
        help="the VM or instance a saved metadata body is read for: a body says nothing of"
        " whose it is (an EC2 instance id; <project>/<zone>/<instance> on GCE); on Azure the"
        " VM (compute.name) of a scheduled events document, without it every VM it names",
    )
    s.set_defaults(func=cmd_parse)

    s = sub.add_parser("run", help="run the daemon")
    s.add_argument("--config", required=True)
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.add_argument(
        "--dry-run",
        action="store_true",
        help="claim, signal, evict and record nothing: log and count what would be done",
    )
    s.set_defaults(func=cmd_run)
    if not tools:
        return p

    from reclaimd import postmortem, report, status

    postmortem.add_parser(sub)
    report.add_parser(sub)
    status.add_parser(sub)
    for add in _plugged_commands():
        add(sub)
    return p


def _plugged_commands() -> list[Callable[[Any], None]]:
    """The commands other distributions add (entry points ``reclaimd.cli``: ``add_parser``).

    The drills are the rig's (reclaimd-chaos, and the checkout's editable install), not the
    image's: where the rig is installed, `reclaimd drill` is a command; elsewhere it is simply
    not one. Declared in metadata, so the product imports nothing of the rig (the import
    contract); an entry whose module is absent (a wheel built without chaos/) is skipped, and
    a name both reclaimd and reclaimd-chaos declare (the chaos image) is added once.
    """
    found: dict[str, Callable[[Any], None]] = {}
    for ep in entry_points(group=PLUGIN_GROUP):
        if ep.name in found:
            continue
        try:
            found[ep.name] = ep.load()
        except ModuleNotFoundError as e:
            parts = ep.module.split(".")
            if e.name not in {".".join(parts[: i + 1]) for i in range(len(parts))}:
                raise
    return list(found.values())


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # A replica loads what it runs, not the other commands: where the rig is installed,
    # `drill` would bring the drills and the generated Kubernetes client into every replica.
    parser = build_parser(tools=argv[:1] != ["run"])
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (UsageError, config.ConfigError, ParseError) as e:
        for line in str(e).splitlines() or [type(e).__name__]:  # one line per error
            print(f"reclaimd {args.command}: {line}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
