"""``make demo``'s last word: what the storm cost, per queue, and whether spot paid for it.

Reads the drill's own ledger topic (``reclaimd.restart-waste.<run id>``, named in the drill's
JSON report) and the drill's plan (its scenario, planned again for the run id: the same
nodes, instance ids and gangs), writes a meter and an hourly FOCUS bill over that fleet
(``chaos.demo_fleet``: no cloud bill exists on a laptop), then runs ``reclaimd report`` on
the three: the table (with "does spot pay?") and the HTML page.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from reclaimd import cli
from reclaimd.ledger.labels import LabelPolicy
from reclaimd.report import ledger_input
from reclaimd.report.ledger_input import InputError

from . import demo_fleet, scenario
from . import stack as stackenv

SCENARIOS = Path(__file__).resolve().parent / "scenarios"


def report(
    plan: scenario.Plan, ledger: str, waste: list[ledger_input.WastePart], html: Path
) -> int:
    """The meter and bill over the plan's fleet beside ``html``, then the table and page."""
    alloc, focus = demo_fleet.write(plan, waste, html.parent, cluster=f"demo-{plan.run_id}")
    common = ["report", "--ledger", ledger, "--ledger", str(alloc), "--focus", str(focus)]
    common += ["--by", "queue"]
    code = cli.main([*common, "--format", "table"])
    if code == 0:
        code = cli.main([*common, "--format", "html", "-o", str(html)])
    return code


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m chaos.demo_report DRILL.json OUT.html", file=sys.stderr)
        return 2
    drill_json, html = Path(args[0]), Path(args[1])
    try:
        doc = json.loads(drill_json.read_text())
        run_id, name = str(doc["run_id"]), str(doc["scenario"])
    except (OSError, ValueError, KeyError) as e:
        print(f"demo report: {drill_json}: no drill report ({type(e).__name__})", file=sys.stderr)
        return 2
    try:
        plan = scenario.plan(scenario.load(SCENARIOS / f"{name}.yaml"), run_id=run_id)
        ledger = f"kafka://{stackenv.load().kafka}/reclaimd.restart-waste.{run_id}"
        waste = ledger_input.read([ledger], None, LabelPolicy()).waste
    except (scenario.ScenarioError, InputError, stackenv.StackNotRunning) as e:
        print(f"demo report: {e}", file=sys.stderr)
        return 2
    if not waste:
        print(f"demo report: no restart-waste events on {ledger}", file=sys.stderr)
        return 2
    print(
        f"\n== what the storm cost (run {run_id}): its {len({w.event_id for w in waste})}"
        " restart-waste events, a meter and an hourly bill over its fleet"
        f" ({demo_fleet.HOURS} hours to the end of the storm's; chaos/demo_fleet.py)"
    )
    code = report(plan, ledger, waste, html)
    if code == 0:
        print(f"== the picture: {html}")
    return code


if __name__ == "__main__":
    sys.exit(main())
