"""``make demo``: what the storm's interruptions cost, per tenant (before the step-by-step demo).

Reads the drill's own ledger topic (``reclaimd.restart-waste.<run id>``, named in the drill's
JSON report) with ``reclaimd report``, priced from ``chaos/demo-rates.csv`` (list prices for
the demo's SKU: no cloud bill exists on a laptop), prints the table and writes the HTML page.
The demo's hour is not closed yet, so no allocation rows exist: the report shows restart
waste only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from reclaimd import cli

from . import stack as stackenv

RATES = Path(__file__).resolve().parent / "demo-rates.csv"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m chaos.demo_report DRILL.json OUT.html", file=sys.stderr)
        return 2
    drill_json, html = Path(args[0]), Path(args[1])
    try:
        run_id = json.loads(drill_json.read_text())["run_id"]
    except (OSError, ValueError, KeyError) as e:
        print(f"demo report: {drill_json}: no drill report ({type(e).__name__})", file=sys.stderr)
        return 2
    ledger = f"kafka://{stackenv.load().kafka}/reclaimd.restart-waste.{run_id}"
    common = ["report", "--ledger", ledger, "--rates", str(RATES), "--by", "tenant"]
    print(f"== what the storm's interruptions cost (run {run_id}, list prices {RATES.name})")
    code = cli.main([*common, "--format", "table"])
    if code == 0:
        code = cli.main([*common, "--format", "html", "-o", str(html)])
        print(f"== the picture: {html}")
    return code


if __name__ == "__main__":
    sys.exit(main())
