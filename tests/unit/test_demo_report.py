"""``make demo``'s cost picture: the storm drill's restart waste, priced by a meter and an hourly
bill over the drill's own fleet (``chaos.demo_fleet``), shows money: every bar a real figure.

The drill is spot-az-storm planned for a fixed run id (its 210 nodes, instance ids and 50
gangs); its restart-waste events are made here as the drill's reclaimd writes them: every gang
with a rank on a us-east-2a node (the notices' targets) stops at 12:32:00 and loses, on every
rank, its GPUs x the time since its last checkpoint or, if later, its pods' start. Figures a
hand can check (chaos/demo_fleet.py's prices):

* inference (team-d): 8 reserved nodes x 4 GPUs x 3 hours = 96 GPU-h x $7.80 = $748.80, and
  the other 4 GPUs of each, 96 GPU-h, the same $748.80 of reserved idle;
* eval: 10 one-GPU jobs on us-east-2a spot nodes, started 600 s before the storm: 10 x 600 s
  = 1/0.6 GPU-h held, and lost (no checkpoint for 1,200 s). At $7.40 (us-east-2a spot) that
  is $12.33 held and $12.33 lost; on demand $12.29 x 1/0.6 = $20.48; net 20.48 - 12.33 -
  12.33 = -$4.18 (unrounded: 1/0.6 x (12.29 - 2 x 7.40) = -4.1833): spot did not pay.
  Break-even (12.29 - 7.40) / 7.40 = 66.08 %, against a waste share of 100 %.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from chaos import demo_report, scenario
from reclaimd.ledger.labels import LabelPolicy
from reclaimd.model import rfc3339
from reclaimd.report import ledger_input, render, spotpays

REPO = Path(__file__).resolve().parents[2]
STORM = datetime(2026, 3, 1, 12, 32, tzinfo=UTC)


def storm_events(plan: scenario.Plan) -> list[dict[str, Any]]:
    targets = {n.node for n in plan.notices if n.node is not None}
    events = []
    for g in plan.gangs:
        if not g.nodes & targets:
            continue
        lost_s = min(g.last_checkpoint_age_s, g.pod_age_s)
        parts: list[dict[str, Any]] = [
            {
                "ResourceId": (n := plan.node(r.node)).instance_id,
                "x_K8sNodeName": n.name,
                "SkuId": n.sku,
                "x_PurchaseOption": n.purchase_option,
                "x_WastedGpuSeconds": g.gpus_per_rank * lost_s,
            }
            for r in g.ranks
        ]
        events.append(
            {
                "schema": "reclaimd.restart-waste/v2",
                "EventId": f"rw-{g.name}",
                "ChargePeriodStart": rfc3339(STORM - timedelta(seconds=lost_s)),
                "ChargePeriodEnd": rfc3339(STORM),
                "Tags": {"tenant": g.tenant, "queue": g.queue},
                "x_WastedGpuSeconds": sum(p["x_WastedGpuSeconds"] for p in parts),
                "x_GangId": f"jobset:rc-{plan.run_id}/{g.name}",
                "x_NoticeId": f"notice-{g.name}",
                "x_CheckpointOutcome": "partial" if g.opt_in else "not_opted_in",
                "x_DeadlineMet": True,
                "x_WasteByInstance": parts,
            }
        )
    return events


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("demo")
    plan = scenario.plan(scenario.load(REPO / "chaos/scenarios/spot-az-storm.yaml"),
                         run_id="0d3m0001")  # fmt: skip
    ledger = out / "storm.jsonl"
    ledger.write_text("".join(json.dumps(e) + "\n" for e in storm_events(plan)))
    waste = ledger_input.read([str(ledger)], None, LabelPolicy()).waste
    html = out / "demo-report.html"
    assert demo_report.report(plan, str(ledger), waste, html) == 0
    return {"plan": plan, "ledger": ledger, "waste": waste, "html": html, "out": out}


def test_the_demo_prices_the_storm_and_the_reservation_by_hand(
    demo: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    plan, out = demo["plan"], demo["out"]
    assert demo_report.report(plan, str(demo["ledger"]), demo["waste"], out / "again.html") == 0
    table = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(table) if line.startswith("does spot pay?"))
    groups = {line.split()[0]: line.split()[1:] for line in table[2:at] if line[:1].isalpha()}
    # inference: 96 GPU-h reserved x $7.80; reserved idle the same
    assert groups["inference"][:5] == ["96.00", "748.80", "0.00", "0.00", "748.80"]
    assert groups["reserved-idle"][5] == "748.80"
    # every group a real figure: no effective cost under $10
    effective = {k: float(v[12].replace(",", "")) for k, v in groups.items() if k != "TOTAL"}
    assert set(effective) == {"eval", "finetune", "inference", "pretrain", "reserved-idle",
                              "unallocated"}  # fmt: skip
    assert min(effective.values()) > 10 and effective["pretrain"] > 10_000
    spot = {line.split()[0]: line.split()[1:] for line in table[at + 3 :] if line[:1].isalpha()}
    assert spot["eval"] == ["1.67", "20.48", "12.33", "1.67", "12.33", "0.00", "0.00", "-4.18",
                            "100.00%", "66.08%", "NO"]  # fmt: skip
    assert spot["pretrain"][-1] == spot["finetune"][-1] == "yes"
    assert set(spot) == {"eval", "finetune", "pretrain", "TOTAL"}


def shoot(page: Path, out: Path, height: int) -> bytes:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is not installed (deploy/local/install.sh installs it)"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", f"--screenshot={out}",
             f"--window-size=1400,{height}", page.resolve().as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    return out.read_bytes()


def test_chromium_draws_every_bar_of_the_demos_picture(demo: dict[str, Any]) -> None:
    from test_postmortem import png_pixels

    page: Path = demo["html"]
    text = page.read_text()
    # each group's bar ends on its effective cost: all above $10, the storm's in the thousands
    totals = [float(v.replace(",", "")) for v in re.findall(r">\$([\d,]+\.\d\d)</text>", text)]
    assert len(totals) == 6 and min(totals) > 10 and max(totals) > 10_000
    assert "lost $4.18</text>" in text
    pixels = list(png_pixels(shoot(page, demo["out"] / "demo.png", 1700)))
    assert len(pixels) == 1400 * 1700

    def count(hex_colour: str) -> int:
        want = bytes.fromhex(hex_colour.removeprefix("#"))
        return sum(1 for p in pixels if all(abs(a - b) <= 6 for a, b in zip(p, want, strict=True)))

    # every segment of the cost picture is drawn (a legend swatch is 196 px: more than that)
    for name in ("cost_spot", "cost_on_demand", "cost_reserved", "reserved_idle_cost",
                 "unallocated_cost", "restart_waste_cost"):  # fmt: skip
        assert count(render.COLOURS[name]) > 300, name
    # and the spot picture: on-demand price bars, eval's loss band across the page
    assert count(spotpays.ON_DEMAND_GREY) > 2000
    assert count(spotpays.LOSS_BAND) > 20_000
