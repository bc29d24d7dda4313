"""The 600-node storm shapes (issue 37), on any checkout: cordon times per shape as JSON.

``python -m chaos.bench.shapes [--tree DIR] [--repeat N]`` runs
``chaos/scenarios/bench-600-plain.yaml`` and ``bench-600-gang.yaml`` (this checkout's files,
whatever tree runs them) with the tree's own ``reclaimd drill run SCENARIO --json REPORT``
(its ``.venv``, its code, its rig), then prints, per shape, sent -> cordoned p50/p95/max over
the notices drilled in full, sent -> all ranks asked the same, and the drill's verdict. Not
part of ``make test``; wrap it in ``flock /tmp/reclaimd-bench.lock`` like every drill on a
shared machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from chaos.bench.latency import percentile
from chaos.bench.storm import after_send

HERE = Path(__file__).resolve().parents[2]
SHAPES = {
    "plain": HERE / "chaos" / "scenarios" / "bench-600-plain.yaml",
    "gang": HERE / "chaos" / "scenarios" / "bench-600-gang.yaml",
}


def dist(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"p50": None, "p95": None, "max": None, "n": 0}
    return {
        "p50": round(percentile(values, 0.5), 3),
        "p95": round(percentile(values, 0.95), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    notices = report.get("notices") or []
    full = [n for n in notices if n.get("response") == "full"]
    sent = [
        datetime.fromisoformat(n["sent_at"].replace("Z", "+00:00"))
        for n in full
        if n.get("sent_at")
    ]
    cordons = [
        datetime.fromisoformat(n["cordoned_at"].replace("Z", "+00:00"))
        for n in full
        if n.get("cordoned_at")
    ]
    return {
        "sent_to_cordoned_s": dist(after_send(full, "cordoned_at")),
        "sent_to_all_asked_s": dist(after_send(notices, "all_signaled_at")),
        "all_cordoned_s": (
            round((max(cordons) - min(sent)).total_seconds(), 3) if cordons and sent else None
        ),
        "notices": len(notices),
        "cordoned": len(cordons),
        "deadlines_met": sum(1 for n in notices if n.get("deadline_met")),
        "verdict_ok": report.get("ok"),
        "failed_checks": [c["name"] for c in report.get("checks", []) if not c.get("ok")],
        "span_files": report.get("span_files") or [],
        "kube_budget": {n: d.get("kube_budget") for n, d in (report.get("daemons") or {}).items()},
    }


def run_shape(tree: Path, scenario: Path, keep: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="reclaimd-shapes-") as tmp:
        out = Path(tmp) / "report.json"
        started = time.monotonic()
        proc = subprocess.run(
            [str(tree / ".venv" / "bin" / "reclaimd"), "drill", "run", str(scenario),
             "--json", str(out), "-q"],
            cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False,
        )  # fmt: skip
        wall = time.monotonic() - started
        if not out.is_file():
            return {"error": f"exit {proc.returncode}", "tail": proc.stdout[-2000:]}
        text = out.read_text(encoding="utf-8")
        result = summarize(json.loads(text))
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            keep.write_text(text, encoding="utf-8")
    result["exit"] = proc.returncode
    result["wall_s"] = round(wall, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chaos.bench.shapes", description=__doc__.splitlines()[0])
    p.add_argument("--tree", type=Path, default=HERE, help="the checkout to run (its .venv)")
    p.add_argument("--shape", choices=sorted(SHAPES), action="append", help="default: both")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--out", type=Path, help="also write the JSON here")
    p.add_argument("--keep", type=Path, help="keep each drill's report in this directory")
    args = p.parse_args(argv)
    tree = args.tree.resolve()
    commit = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    result: dict[str, Any] = {"tree": str(tree), "commit": commit, "shapes": {}}
    for name in args.shape or sorted(SHAPES):
        runs = []
        for i in range(args.repeat):
            kept = args.keep / f"{commit}-{name}-{i + 1}.json" if args.keep else None
            r = run_shape(tree, SHAPES[name], kept)
            print(f"shapes: {commit} {name} run {i + 1}: {json.dumps(r)}", file=sys.stderr)
            runs.append(r)
        result["shapes"][name] = runs
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
