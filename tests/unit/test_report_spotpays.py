"""``reclaimd report``'s "does spot pay?" by hand: a bill and a ledger small enough to price on
paper; every expected figure is computed in the comments.

Bill, 12:00, p5.48xlarge (8 GPUs):
  i-s1  spot       $32.00 Dynamic  -> $4 / GPU-h
  i-s2  spot       $72.00 Dynamic  -> $9 / GPU-h   (a thin discount: spot prices vary by zone)
  i-od  on-demand  $80.00 Standard -> $10 / GPU-h  (the on-demand price of p5 in this bill)

Ledger, 12:00:
  team-a / pretrain:  8 GPU-h on i-s1 (spot), 4 on i-od
  team-b / eval:      4 GPU-h on i-s2 (spot)
  team-b / finetune:  4 GPU-h on i-s2 (spot), 4 on i-od
  restart waste (12:30):    rw-1 pretrain 2 GPU-h on i-s1 + 1 on i-od; rw-2 eval 0.5 on i-s2
  restart overhead (12:45): ro-1 pretrain 1 GPU-h on i-s1 + 0.5 on i-od; ro-2 eval 0.25 on i-s2

Does spot pay, by queue (net = on-demand - spot - waste at its rate - overhead at on-demand):
  pretrain  8 GPU-h: od 8 x 10 = 80, spot 8 x 4 = 32, waste 2 x 4 = 8 (the i-od part is not
            spot), overhead 1 x 10 = 10 -> net 30.00; waste 2/8 = 25 %; break-even
            (80 - 32 - 10) / (8 x 4) = 118.75 %
  eval      4 GPU-h: od 40, spot 4 x 9 = 36, waste 0.5 x 9 = 4.50, overhead 0.25 x 10 = 2.50
            -> net -3.00: spot did not pay; waste 12.5 %; break-even (40 - 36 - 2.5) / (4 x 9)
            = 4.1667 %
  finetune  4 GPU-h: od 40, spot 36, nothing lost -> net 4.00; break-even at its spot rate
            (40 - 36) / (4 x 9) = 11.1111 %
  TOTAL     16 GPU-h: od 160, spot 104, waste 2.5 GPU-h $12.50, overhead 1.25 GPU-h $12.50
            -> net 31.00; waste 15.625 %; break-even (160 - 104 - 12.5) / (16 x 12.5 / 2.5)
            = 54.375 %
By tenant: team-a is pretrain; team-b is eval + finetune: od 80, spot 72, waste 4.50,
overhead 2.50 -> net 1.00 (spot paid, barely, though it did not for eval); waste 0.5/8 =
6.25 %; break-even (80 - 72 - 2.5) / (8 x 9) = 7.6389 %.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from test_report_bill import H12, alloc, aws, part, waste, write_csv, write_jsonl
from test_report_overhead import overhead, overhead_part

from reclaimd import cli
from reclaimd.report import Window, build, render, spotpays


def with_queue(event: dict[str, Any], queue: str) -> dict[str, Any]:
    event["Tags"] = {**event["Tags"], "queue": queue}
    event["EventId"] += f"-{queue}"
    return event


def bill_rows() -> list[dict[str, Any]]:
    return [
        aws("i-s1", 32.00, PricingCategory="Dynamic"),
        aws("i-s2", 72.00, PricingCategory="Dynamic"),
        aws("i-od", 80.00),
    ]


def ledger_rows() -> list[dict[str, Any]]:
    return [
        with_queue(alloc("team-a", "n-s1", "i-s1", 8, "spot"), "pretrain"),
        with_queue(alloc("team-a", "n-od", "i-od", 4, "on_demand"), "pretrain"),
        with_queue(alloc("team-b", "n-s2", "i-s2", 4, "spot"), "eval"),
        with_queue(alloc("team-b", "n-s2", "i-s2", 4, "spot"), "finetune"),
        with_queue(alloc("team-b", "n-od", "i-od", 4, "on_demand"), "finetune"),
        with_queue(
            waste(
                "rw-1",
                "team-a",
                [part("i-s1", "n-s1", "spot", 7200), part("i-od", "n-od", "on_demand", 3600)],
                "n-1",
            ),
            "pretrain",
        ),
        with_queue(waste("rw-2", "team-b", [part("i-s2", "n-s2", "spot", 1800)], "n-2"), "eval"),
        with_queue(
            overhead(
                "ro-1",
                "team-a",
                [
                    overhead_part("i-s1", "n-s1", "spot", 3600),
                    overhead_part("i-od", "n-od", "on_demand", 1800),
                ],
                restarted=H12 + timedelta(minutes=45),
            ),
            "pretrain",
        ),
        with_queue(
            overhead("ro-2", "team-b", [overhead_part("i-s2", "n-s2", "spot", 900)]), "eval"
        ),
    ]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "ledger": write_jsonl(tmp_path / "ledger.jsonl", ledger_rows()),
        "focus": write_csv(tmp_path / "focus.csv", bill_rows()),
    }


def report_json(files: dict[str, Path], by: str, *extra: str) -> dict[str, Any]:
    args = ["report", "--ledger", str(files["ledger"]), "--focus", str(files["focus"])]
    out = files["ledger"].parent / f"report-{by}.json"
    assert cli.main([*args, "--by", by, "--format", "json", "-o", str(out), *extra]) == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def row(key: str, by: str, figures: tuple[float, ...], shares: tuple[float, float | None],
        pays: bool) -> dict[str, Any]:  # fmt: skip
    names = ["spot_gpu_hours", "on_demand_cost", "spot_cost", "waste_gpu_hours", "waste_cost"]
    names += ["overhead_gpu_hours", "overhead_cost", "net_saving"]
    return {
        by: key,
        **dict(zip(names, figures, strict=True)),
        "waste_share": shares[0],
        "break_even_waste_share": shares[1],
        "pays": pays,
    }


# the module docstring's figures
PRETRAIN = (8.0, 80.00, 32.00, 2.0, 8.00, 1.0, 10.00, 30.00)
EVAL = (4.0, 40.00, 36.00, 0.5, 4.50, 0.25, 2.50, -3.00)
FINETUNE = (4.0, 40.00, 36.00, 0.0, 0.00, 0.0, 0.00, 4.00)
TOTAL = (16.0, 160.00, 104.00, 2.5, 12.50, 1.25, 12.50, 31.00)


def test_by_queue_each_figure_to_the_cent(files: dict[str, Path]) -> None:
    doc = report_json(files, "queue")
    assert doc["spot_pays"]["groups"] == [
        row("eval", "queue", EVAL, (0.125, round(1.5 / 36, 6)), False),
        row("finetune", "queue", FINETUNE, (0.0, round(4 / 36, 6)), True),
        row("pretrain", "queue", PRETRAIN, (0.25, 1.1875), True),
    ]
    assert doc["spot_pays"]["total"] == row("TOTAL", "queue", TOTAL, (0.15625, 0.54375), True)
    # the group's own columns carry the sums (CSV and Athena have them too): spot_net_savings
    # is the net saving
    pretrain = next(g for g in doc["groups"] if g["queue"] == "pretrain")
    spot = ["spot_on_demand_cost", "cost_spot", "spot_waste_gpu_hours", "spot_waste_cost"]
    spot += ["spot_overhead_gpu_hours", "spot_overhead_cost", "spot_net_savings"]
    assert tuple(pretrain[k] for k in spot) == (80.00, 32.00, 2.0, 8.00, 1.0, 10.00, 30.00)
    # all restart waste and overhead, spot or not: 3 GPU-h $18, 1.5 GPU-h $9 (at $4 and $10)
    assert (pretrain["restart_waste_cost"], pretrain["restart_overhead_cost"]) == (18.00, 9.00)


def test_by_tenant_a_tenant_can_pay_where_one_of_its_queues_did_not(
    files: dict[str, Path],
) -> None:
    doc = report_json(files, "tenant")
    team_b = (8.0, 80.00, 72.00, 0.5, 4.50, 0.25, 2.50, 1.00)
    assert doc["spot_pays"]["groups"] == [
        row("team-a", "tenant", PRETRAIN, (0.25, 1.1875), True),
        row("team-b", "tenant", team_b, (0.0625, round(5.5 / 72, 6)), True),
    ]


def test_the_on_demand_price_of_the_rates_file_prices_the_overhead(
    files: dict[str, Path], tmp_path: Path
) -> None:
    # on_demand $12 in the rates file overrides the bill's $10, for the hours and the overhead:
    # pretrain od 8 x 12 = 96, overhead 1 x 12 = 12: net 96 - 32 - 8 - 12 = 44
    rates = tmp_path / "rates.csv"
    rates.write_text("sku,purchase_option,usd_per_gpu_hour\np5.48xlarge,on_demand,12\n")
    doc = report_json(files, "queue", "--rates", str(rates))
    pretrain = doc["spot_pays"]["groups"][2]
    assert (pretrain["on_demand_cost"], pretrain["overhead_cost"], pretrain["net_saving"]) == (
        96.00,
        12.00,
        44.00,
    )


def test_the_break_even_share_is_where_the_saving_is_gone() -> None:
    # eval with its waste grown to the break-even share at its own rate ($9): 4 x 1.5/36 GPU-h
    # = 1/6 GPU-h x $9 = $1.50, and 40 - 36 - 1.50 - 2.50 = 0
    r = spotpays.SpotPays("eval", 4, 40, 36, 0.5, 4.5, 0.25, 2.5)
    even = r.break_even_waste_share
    assert even is not None and even == pytest.approx(1.5 / 36)
    grown = spotpays.SpotPays("eval", 4, 40, 36, 4 * even, 4 * even * 9, 0.25, 2.5)
    assert grown.net_saving == pytest.approx(0) and grown.pays
    # a group where spot loses even without waste: break-even 0
    assert spotpays.SpotPays("x", 4, 40, 39, 0, 0, 0.25, 2.5).break_even_waste_share == 0


def test_the_table_marks_the_group_where_spot_did_not_pay(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["report", "--ledger", str(files["ledger"]), "--focus", str(files["focus"])]
    assert cli.main([*args, "--by", "queue"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("does spot pay?"))
    assert lines[at + 1].split()[:3] == ["queue", "spot", "GPU-h"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[at + 3 :] if line[:1].isalpha()}
    assert rows["eval"] == ["4.00", "40.00", "36.00", "0.50", "4.50", "0.25", "2.50", "-3.00",
                            "12.50%", "4.17%", "NO"]  # fmt: skip
    assert rows["pretrain"][-4:] == ["30.00", "25.00%", "118.75%", "yes"]
    assert rows["finetune"][-4:] == ["4.00", "0.00%", "11.11%", "yes"]
    # 15.625 % and 54.375 % to two places, as format() rounds doubles: 15.625 is exact and
    # goes to the even digit, 0.54375 is stored as 0.543749999... (JSON has them unrounded)
    assert rows["TOTAL"][-4:] == ["31.00", "15.62%", "54.37%", "yes"]


def groups(files: dict[str, Path], by: str = "queue") -> list[Any]:
    return build([str(files["ledger"])], by=by, focus=files["focus"], rates=None, window=Window())


def test_the_page_colours_the_group_where_spot_did_not_pay(files: dict[str, Path]) -> None:
    page = render.as_html(groups(files), Window(), "queue")
    assert page.count(f'fill="{spotpays.LOSS_BAND}"/>') == 1  # eval's band, nothing else
    assert page.count('<tr class="loss">') == 1
    assert '<tr class="loss"><td>eval</td>' in page
    assert f'fill="{spotpays.LOSS_TEXT}">lost $3.00</text>' in page
    assert f'fill="{spotpays.SAVED_TEXT}">saved $30.00</text>' in page
    # by tenant nobody lost: no band
    assert spotpays.LOSS_BAND + '"/>' not in render.as_html(groups(files, "tenant"), Window(),
                                                             "tenant")  # fmt: skip


def test_chromium_draws_the_loss_band_and_the_bars(files: dict[str, Path], tmp_path: Path) -> None:
    from test_postmortem import png_pixels, screenshot

    page = tmp_path / "spot.html"
    # the spot section alone, at the top of the page: the screenshot is 1400 x 900
    page.write_text("<html><body>" + spotpays.as_html(groups(files), "queue") + "</body></html>")
    pixels = list(png_pixels(screenshot(page, tmp_path / "spot.png")))

    def count(hex_colour: str) -> int:
        want = bytes.fromhex(hex_colour.removeprefix("#"))
        return sum(1 for p in pixels if all(abs(a - b) <= 6 for a, b in zip(p, want, strict=True)))

    band, grey = count(spotpays.LOSS_BAND), count(spotpays.ON_DEMAND_GREY)
    spot, amber = count(spotpays.SPOT_GREEN), count(spotpays.OVERHEAD_AMBER)
    assert band > 20_000  # one band 1100 px wide, 40 high, less what is drawn on it
    assert grey > 1000 and spot > 1000 and amber > 50
    # bars scale with dollars: on-demand 80 + 40 + 40 against spot 32 + 36 + 36
    assert 1.3 < grey / spot < 1.8
