"""The ``reclaimd drill`` command line: its parser (``add_parser``: ``drill run`` and ``drill
check``), the command, and the plan summary ``drill check`` prints. Exit status: 0 when every
expectation holds, 1 when one does not, 2 for a bad scenario or a stack that is not running.
Heavy clients are imported when a drill runs, not when the CLI starts, so ``reclaimd parse``
stays quick; so is ``chaos.drill``, which imports this module to re-export its names.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from reclaimd import postmortemsvg

from . import report
from .scenario import FaultKind, Plan, ScenarioError
from .scenario import load as load_scenario
from .scenario import plan as plan_scenario

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_parser(sub: Any) -> None:
    """``drill run`` and ``drill check`` under ``reclaimd``'s subcommands."""
    p = sub.add_parser("drill", help="chaos drills: rehearse interruptions on the local stack")
    drills = p.add_subparsers(dest="drill_command", metavar="ACTION")
    drills.required = True
    r = drills.add_parser("run", help="run a scenario against the local stack and judge it")
    r.add_argument("scenario", help="scenario YAML (see docs/drills.md)")
    r.add_argument("--json", metavar="REPORT", help="write the JSON report here")
    r.add_argument("--all-rows", action="store_true", help="print every notice and gang")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    r.add_argument(
        "--timeline", action="store_true", help="print the slowest notice's post-mortem timeline"
    )
    r.add_argument("--svg", metavar="FILE", help="write the slowest notice's post-mortem picture")
    r.add_argument(
        "--apiserver-proxy",
        choices=("auto", "on", "off"),
        default="auto",
        help="each replica reaches the apiserver through a proxy of its own: auto (only when"
        " a partition fault needs it), on, off (to measure what it costs)",
    )
    g = r.add_argument_group(
        "game day", "against the reclaimd release deployed in a cluster (docs/drills.md)"
    )
    g.add_argument("--cluster", action="store_true", help="game day: the deployed release")
    g.add_argument("--kubeconfig", help="default: in-cluster, else $KUBECONFIG")
    g.add_argument("--release", help="the release's Helm name")
    g.add_argument("--release-namespace", default="reclaimd")
    g.add_argument("--node-label", metavar="KEY=VALUE", help="only nodes with this label")
    g.add_argument("--max-nodes", type=int, help="never more nodes than this")
    g.add_argument("--namespace", default="", help="the probes' namespace (default gd-<run>)")
    g.add_argument("--spans", default="", help="the release's span files (a glob), to judge")
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting the release keeps in a Secret (ledger.bootstrap=...)",
    )
    g.add_argument("--dry-run", action="store_true", help="bind and print the plan; change nothing")
    r.set_defaults(func=cmd_drill)
    c = drills.add_parser("check", help="validate a scenario and print its plan (no stack)")
    c.add_argument("scenario")
    c.set_defaults(func=cmd_drill)


def cmd_drill(args: argparse.Namespace) -> int:
    """0: every expectation met; 1: one is not; 2: bad scenario or no stack."""
    from . import stack as stackenv
    from .drill import Progress, run_drill, slowest, slowest_timeline

    try:
        scenario = load_scenario(args.scenario)
        if args.drill_command == "check":
            print(describe_plan(plan_scenario(scenario, run_id="check")))
            return EXIT_OK
        if getattr(args, "cluster", False):
            return cmd_gameday(args, scenario)
        proxy = {"auto": None, "on": True, "off": False}[getattr(args, "apiserver_proxy", "auto")]
        if proxy is False and any(f.kind is FaultKind.PARTITION for f in scenario.faults):
            raise ScenarioError("--apiserver-proxy off: a partition fault needs the proxy")
        verdict = asyncio.run(
            run_drill(
                scenario,
                progress=Progress(quiet=bool(getattr(args, "quiet", False))),
                apiserver_proxy=proxy,
            )
        )
    except (ScenarioError, stackenv.StackNotRunning) as e:
        print(f"reclaimd drill: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(report.render(verdict, all_rows=bool(args.all_rows)))
    if args.timeline:
        timeline = slowest_timeline(verdict)
        print(f"\n== slowest notice\n{timeline or '(no trace found)'}")
    if args.svg:
        picture = slowest(verdict)
        if picture is not None:
            Path(args.svg).write_text(postmortemsvg.render_svg(picture))
            print(f"post-mortem picture of the slowest notice: {args.svg}")
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(verdict), indent=2) + "\n")
    return EXIT_OK if verdict.ok else EXIT_FAILED


def cmd_gameday(args: argparse.Namespace, scenario: Any) -> int:
    """``drill run --cluster``: 0, 1 as a local drill; 2 for a refusal (nothing changed)."""
    from reclaimd.cluster.errors import ConfigError

    from .drill import Progress
    from .gameday import GameDay, Options
    from .gameday_target import GameDayError

    if not args.release or not args.node_label or args.max_nodes is None:
        raise ScenarioError("--cluster needs --release, --node-label and --max-nodes")
    overrides = dict(kv.partition("=")[::2] for kv in args.set)
    options = Options(
        release=args.release,
        release_namespace=args.release_namespace,
        node_label=args.node_label,
        max_nodes=args.max_nodes,
        namespace=args.namespace,
        kubeconfig=args.kubeconfig,
        spans=args.spans,
        overrides=overrides,
        dry_run=args.dry_run,
    )
    day = GameDay(scenario, options, say=Progress(quiet=bool(args.quiet)))
    try:
        outcome = asyncio.run(day.run())
    except (GameDayError, ConfigError) as e:
        print(f"reclaimd drill: {e}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(outcome, str):
        print(outcome)
        return EXIT_OK
    print(report.render(outcome, all_rows=bool(args.all_rows)))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(outcome), indent=2) + "\n")
    return EXIT_OK if outcome.ok else EXIT_FAILED


def describe_plan(plan: Plan) -> str:
    s = plan.scenario
    per_source: dict[str, int] = {}
    for n in plan.notices:
        per_source[n.source.value] = per_source.get(n.source.value, 0) + 1
    affected = {g.name for n in plan.notices for g in plan.gangs_on(n.node or "")} | {
        n.gang for n in plan.notices if n.gang
    }
    lines = [
        f"{s.name}: {len(plan.nodes)} nodes in {len(s.cluster.pools)} pool(s),"
        f" {len(plan.gangs)} gangs ({sum(len(g.ranks) for g in plan.gangs)} ranks)",
        f"notices: {', '.join(f'{k} x{v}' for k, v in sorted(per_source.items()))};"
        f" {len(plan.garbage)} malformed; {len(affected)} gang(s) touched",
        f"reclaimd: {s.reclaimd.replicas} replica(s)"
        + (
            f", settings {json.dumps(s.reclaimd.as_settings())}" if s.reclaimd.as_settings() else ""
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m chaos.drill run SCENARIO`` (what ``reclaimd drill`` calls)."""
    parser = argparse.ArgumentParser(prog="reclaimd")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result
