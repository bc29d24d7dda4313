"""The post-mortem from a synthetic trace with a miss: rows, scales, text, SVG, HTML, OTLP/JSON
input, the command line, and the page as Chromium draws it."""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
import tempfile
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from reclaimd import postmortem, postmortemsvg

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
NOTICE = "aws.ec2.spot-0123456789abcdef01234567"
T0 = datetime(2025, 1, 1, 12, 0, 0, 500000, tzinfo=UTC)  # received, 0.5 s after the notice
ISSUED = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
SVG = "{http://www.w3.org/2000/svg}"


def ns(seconds: float) -> int:
    return int((T0 + timedelta(seconds=seconds)).timestamp() * 1e9)


def span(
    name: str,
    start: float,
    end: float,
    sid: int,
    *,
    parent: int = 1,
    status: str = "UNSET",
    trace: str = TRACE,
    **attributes: Any,
) -> dict[str, Any]:
    return {
        "trace_id": trace,
        "span_id": f"{sid:016x}",
        "parent_id": f"{parent:016x}" if parent else "",
        "name": name,
        "kind": "INTERNAL",
        "start_ns": ns(start),
        "end_ns": ns(end),
        "status": status,
        "status_message": "",
        "attributes": attributes,
        "events": [],
        "links": [],
    }


def pod(name: str, node: str, **extra: Any) -> dict[str, Any]:
    return {"k8s.namespace.name": "ml", "k8s.pod.name": name, "k8s.node.name": node, **extra}


def missed_trace(*, window_s: float = 20.0, trace: str = TRACE) -> list[dict[str, Any]]:
    """A 20 s spot window (from the notice), received 0.5 s late: rank 1 never acks, its pod
    outlives the deadline, so the drain and the ledger end after it."""
    gang = "jobset:ml/llm"
    deadline = ISSUED + timedelta(seconds=window_s)
    return [
        span(
            "reclaimd.notice",
            0,
            22.1,
            1,
            parent=0,
            trace=trace,
            **{
                "reclaimd.notice.id": NOTICE,
                "reclaimd.notice.source": "aws.ec2.spot",
                "reclaimd.notice.kind": "spot_interruption",
                "reclaimd.notice.target": "gpu-0",
                "reclaimd.deadline": deadline.isoformat(),
                "reclaimd.window_s": window_s,
                "reclaimd.deadline_met": False,
            },
        ),
        span("reclaimd.claim", 0.0, 0.05, 2, trace=trace),
        span("reclaimd.resolve", 0.05, 0.06, 3, trace=trace, **{"k8s.node.name": "gpu-0"}),
        span("reclaimd.cordon", 0.06, 0.2, 4, trace=trace),
        span("reclaimd.checkpoint", 0.2, 15.0, 5, trace=trace),
        span(
            "reclaimd.checkpoint.rank",
            0.2,
            3.0,
            6,
            parent=5,
            trace=trace,
            **pod("llm-0", "gpu-0", **{"reclaimd.rank": 0, "reclaimd.gang": gang}),
            **{"reclaimd.acked": True, "reclaimd.durable": True},
        ),
        span(
            "reclaimd.checkpoint.rank",
            0.2,
            15.0,
            7,
            parent=5,
            status="ERROR",
            trace=trace,
            **pod("llm-1", "gpu-1", **{"reclaimd.rank": 1, "reclaimd.gang": gang}),
            **{"reclaimd.acked": False, "reclaimd.error": "no reply within 14.8s"},
        ),
        span("reclaimd.drain", 15.0, 22.0, 8, trace=trace),
        span(
            "reclaimd.evict",
            15.0,
            16.0,
            9,
            parent=8,
            trace=trace,
            **pod("llm-0", "gpu-0", **{"reclaimd.eviction": "evicted", "reclaimd.gone": True}),
        ),
        span(
            "reclaimd.evict",
            15.0,
            22.0,
            10,
            parent=8,
            trace=trace,
            **pod("llm-1", "gpu-1", **{"reclaimd.eviction": "deleted", "reclaimd.gone": True}),
        ),
        span(
            "reclaimd.evict",
            15.0,
            15.5,
            11,
            parent=8,
            trace=trace,
            **pod("eval-0", "gpu-0", **{"reclaimd.eviction": "evicted", "reclaimd.gone": True}),
        ),
        span("reclaimd.ledger", 22.0, 22.1, 12, trace=trace, **{"reclaimd.events": 2}),
    ]


def quick_trace() -> list[dict[str, Any]]:
    """Handled in about a second of a 120 s window: the deadline is off the zoomed scale."""
    spans = [s for s in missed_trace(window_s=120.0) if s["name"] != "reclaimd.evict"]
    for s in spans:
        # squeeze everything into the first 1.1 s
        s["start_ns"] = ns((s["start_ns"] - ns(0)) / 1e9 / 20)
        s["end_ns"] = ns((s["end_ns"] - ns(0)) / 1e9 / 20)
        s["status"] = "UNSET"
        s["attributes"].pop("reclaimd.error", None)
        if "reclaimd.acked" in s["attributes"]:
            s["attributes"]["reclaimd.acked"] = True
    spans[0]["attributes"]["reclaimd.deadline_met"] = True
    return spans


def write(path: Path, spans: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(s) + "\n" for s in spans))
    return path


@pytest.fixture
def missed(tmp_path: Path) -> Path:
    return write(tmp_path / "spans.jsonl", missed_trace())


# --- rows and sections --------------------------------------------------------------------


def test_timeline_rows_sections_and_the_window(missed: Path) -> None:
    t = postmortem.load(missed, NOTICE)
    assert t.trace_id == TRACE and t.source == "aws.ec2.spot" and t.target == "gpu-0"
    assert t.window_s == pytest.approx(19.5)  # 20 s from the notice, received 0.5 s late
    assert t.receipt_lag_s == pytest.approx(0.5)
    assert t.total_s == pytest.approx(22.1)
    assert t.deadline_met is False
    sections = dict(t.sections())
    assert list(sections) == ["notice", "jobset:ml/llm", postmortem.NO_GANG]
    assert [r.step for r in sections["notice"]] == [
        "claim",
        "resolve",
        "cordon",
        "checkpoint",
        "drain",
        "ledger",
    ]
    gang = sections["jobset:ml/llm"]
    # ranks first (by rank), then the evictions, whose gang came from the rank spans
    assert [(r.label, r.subject, r.node) for r in gang] == [
        ("rank 0", "ml/llm-0", "gpu-0"),
        ("rank 1", "ml/llm-1", "gpu-1"),
        ("evict", "ml/llm-0", "gpu-0"),
        ("evict", "ml/llm-1", "gpu-1"),
    ]
    assert [r.subject for r in sections[postmortem.NO_GANG]] == ["ml/eval-0"]
    rank1 = gang[1]
    assert not rank1.ok and rank1.detail == "no ack: no reply within 14.8s"
    missed_rows = {(r.step, r.subject) for r in t.rows if t.missed(r)}
    assert missed_rows == {("evict", "ml/llm-1"), ("drain", ""), ("ledger", "")}
    assert t.left_s(gang[3]) == pytest.approx(19.5 - 22.0)


def test_found_by_trace_id_and_by_traceparent(missed: Path) -> None:
    assert postmortem.load(missed, TRACE).notice_id == NOTICE
    assert postmortem.load(missed, f"00-{TRACE}-00f067aa0ba902b7-01").notice_id == NOTICE
    with pytest.raises(postmortem.NotFound):
        postmortem.load(missed, "aws.ec2.spot-nope")


def test_a_resumed_notice_shows_its_last_attempt(tmp_path: Path) -> None:
    first = "0" * 31 + "1"
    earlier = missed_trace(trace=first)
    for s in earlier:  # the first attempt: a process that died a minute earlier
        s["start_ns"] -= 60 * 10**9
        s["end_ns"] -= 60 * 10**9
    a = write(tmp_path / "a.jsonl", earlier)
    b = write(tmp_path / "b.jsonl", missed_trace())
    t = postmortem.load([a, b], NOTICE)
    assert t.trace_id == TRACE and t.other_traces == (first,)


def test_a_torn_last_line_is_skipped(missed: Path) -> None:
    with missed.open("a") as f:
        f.write('{"trace_id": "4bf9')
    assert len(postmortem.load(missed, NOTICE).rows) == 11


# --- scales and text ----------------------------------------------------------------------


def test_zoom_reaches_a_near_deadline_and_names_a_far_one(tmp_path: Path) -> None:
    near = postmortem.load(write(tmp_path / "near.jsonl", missed_trace()), NOTICE)
    zs = postmortem.zoom_scale(near, 100)
    assert zs.deadline == pytest.approx(19.5) and zs.hi >= 22.1
    far = postmortem.load(write(tmp_path / "far.jsonl", quick_trace()), NOTICE)
    zf = postmortem.zoom_scale(far, 100)
    assert zf.deadline is None and zf.hi < 2.0  # seconds, not the 120 s window
    assert far.total_s < 1.2 and far.window_s == pytest.approx(119.5)


def test_nice_ticks() -> None:
    assert postmortem.nice_step(1.0, 8) == pytest.approx(0.2)
    assert postmortem.nice_step(120.0, 8) == pytest.approx(20.0)
    assert postmortem.nice_step(0.03, 8) == pytest.approx(0.005)


def bar_of(line: str) -> str:
    return line[line.index("[") + 1 : line.index("]")]


def test_text_marks_misses_and_the_deadline(missed: Path) -> None:
    text = postmortem.render_text(postmortem.load(missed, NOTICE), width=40)
    lines = text.splitlines()
    assert "2025-01-01T12:00:20Z = 19.5 s after receipt" in lines[2]
    assert "received 500 ms after" in lines[2] and "2.60 s late: DEADLINE MISSED" in lines[2]
    evict1 = next(line for line in lines if "evict" in line and "llm-1" in line)
    assert evict1.endswith("MISS deleted") and " -2.50s " in evict1  # left: 19.5 - 22.0
    rank1 = next(line for line in lines if "rank 1" in line)
    assert rank1.endswith("FAIL no ack: no reply within 14.8s")
    assert "  gang jobset:ml/llm" in lines
    # the deadline is one column of every zoomed row: '|', or '!' where a bar crosses it
    rows = [line for line in lines if line.startswith("    ") and "[" in line]
    assert len(rows) == 11
    columns = {
        bar_of(line).find("|") if "|" in bar_of(line) else bar_of(line).find("!") for line in rows
    }
    assert len(columns) == 1 and columns.pop() > 0
    assert "!" in bar_of(evict1) and "!" not in bar_of(rank1)
    # the window overview: handling runs past the deadline mark
    window = next(line for line in lines if line.startswith("  window"))
    assert "!" in bar_of(window) and bar_of(window).rstrip().endswith("#")


def test_text_of_a_quick_notice_keeps_the_handling_visible(tmp_path: Path) -> None:
    t = postmortem.load(write(tmp_path / "s.jsonl", quick_trace()), NOTICE)
    text = postmortem.render_text(t, width=40)
    lines = text.splitlines()
    assert "deadline met" in text and "off this scale" in text
    checkpoint = next(line for line in lines if line.startswith("    checkpoint"))
    assert bar_of(checkpoint).count("#") >= 20  # most of the zoomed width, not 1 cell of 120 s
    assert checkpoint.split("]", 1)[1].startswith("> ok")
    window = next(line for line in lines if line.startswith("  window"))
    assert bar_of(window).count("#") == 1 and bar_of(window).rstrip().endswith("|")


# --- the picture --------------------------------------------------------------------------


def bars(svg: str) -> list[ElementTree.Element]:
    root = ElementTree.fromstring(svg)
    return [e for e in root.iter(f"{SVG}rect") if "bar" in (e.get("class") or "").split()]


def test_svg_has_the_deadline_line_and_red_misses(missed: Path) -> None:
    t = postmortem.load(missed, NOTICE)
    svg = postmortemsvg.render_svg(t)
    root = ElementTree.fromstring(svg)
    deadlines = [e for e in root.iter(f"{SVG}line") if e.get("class") == "deadline"]
    assert len(deadlines) == 2  # on the window overview and on the zoomed timeline
    assert all(e.get("stroke") == postmortemsvg.DEADLINE_RED for e in deadlines)
    red = [b for b in bars(svg) if b.get("fill") == postmortemsvg.MISS_RED]
    assert {(b.get("data-step"), "miss" in (b.get("class") or "")) for b in red} == {
        ("evict", True),
        ("drain", True),
        ("ledger", True),
    }
    amber = [b for b in bars(svg) if b.get("fill") == postmortemsvg.FAIL_AMBER]
    assert [b.get("data-step") for b in amber] == ["checkpoint.rank"]  # rank 1, in time
    assert len(bars(svg)) == len(t.rows)
    # the zoomed deadline line stands left of the late bars' ends
    zoomed = deadlines[1]
    late = next(b for b in red if b.get("data-step") == "evict")
    assert float(zoomed.get("x1", "0")) < float(late.get("x", "0")) + float(late.get("width", "0"))


def test_svg_of_a_quick_notice_names_the_off_scale_deadline(tmp_path: Path) -> None:
    svg = postmortemsvg.render_svg(
        postmortem.load(write(tmp_path / "s.jsonl", quick_trace()), NOTICE)
    )
    root = ElementTree.fromstring(svg)
    off = [e for e in root.iter(f"{SVG}text") if e.get("class") == "deadline-off-scale"]
    assert len(off) == 1 and "119" in "".join(off[0].itertext())
    assert not [b for b in bars(svg) if b.get("fill") == postmortemsvg.MISS_RED]


def test_html_is_self_contained(missed: Path) -> None:
    page = postmortemsvg.render_html(postmortem.load(missed, NOTICE))
    assert page.startswith("<!doctype html>") and "<svg" in page
    for needle in ("src=", "href=", "<script", "@import", "url("):
        assert needle not in page
    assert page.count('<tr class="miss">') == 3


# --- OTLP/JSON input ----------------------------------------------------------------------


def otlp_value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": str(v)}


def to_otlp(spans: list[dict[str, Any]]) -> dict[str, Any]:
    codes = {"UNSET": 0, "OK": 1, "ERROR": 2}
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": otlp_value("r")}]},
                "scopeSpans": [
                    {
                        "scope": {"name": "reclaimd"},
                        "spans": [
                            {
                                "traceId": s["trace_id"].upper(),  # case must not matter
                                "spanId": s["span_id"],
                                "parentSpanId": s["parent_id"],
                                "name": s["name"],
                                "kind": 1,
                                "startTimeUnixNano": str(s["start_ns"]),
                                "endTimeUnixNano": str(s["end_ns"]),
                                "attributes": [
                                    {"key": k, "value": otlp_value(v)}
                                    for k, v in s["attributes"].items()
                                ],
                                "status": {"code": codes[s["status"]]},
                            }
                            for s in spans
                        ],
                    }
                ],
            }
        ]
    }


def test_otlp_json_lines_give_the_same_timeline(tmp_path: Path, missed: Path) -> None:
    spans = missed_trace()
    path = tmp_path / "collector.jsonl"
    # as a collector writes it: batches, one request per line
    path.write_text(json.dumps(to_otlp(spans[:5])) + "\n" + json.dumps(to_otlp(spans[5:])) + "\n")
    assert postmortem.load(path, NOTICE) == postmortem.load(missed, NOTICE)


# --- command line -------------------------------------------------------------------------


def cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="reclaimd")
    postmortem.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["postmortem", *argv])


def test_cli_writes_text_svg_and_html(
    missed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    svg, page = tmp_path / "p.svg", tmp_path / "p.html"
    args = cli(NOTICE, "--from", str(missed), "--svg", str(svg), "--html", str(page))
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"notice {NOTICE}") and "DEADLINE MISSED" in out
    ElementTree.fromstring(svg.read_text())  # well-formed
    assert page.read_text().startswith("<!doctype html>")


@pytest.mark.parametrize(
    ("key", "from_", "message"),
    [
        ("nope", "spans.jsonl", "no trace for notice or trace id 'nope'"),
        (NOTICE, "missing.jsonl", "No such file or directory"),
    ],
)
def test_cli_bad_input_is_exit_2_and_one_line(
    missed: Path, key: str, from_: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = cli(key, "--from", str(missed.parent / from_))
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("reclaimd postmortem: ") and message in err


# --- what a person sees -------------------------------------------------------------------


def png_pixels(data: bytes) -> Iterator[tuple[int, int, int]]:
    """RGB(A) pixels of an 8-bit, non-interlaced PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, _, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    prev = bytearray(stride)
    for row in range(len(raw) // (stride + 1)):
        f, line = (
            raw[row * (stride + 1)],
            bytearray(raw[row * (stride + 1) + 1 : (row + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        prev = line
        for x in range(0, stride, channels):
            yield line[x], line[x + 1], line[x + 2]


def screenshot(page: Path, out: Path) -> bytes:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is not installed (deploy/local/install.sh installs it)"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--screenshot={out}",
                "--window-size=1400,900",
                page.resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    return out.read_bytes()


def test_chromium_draws_the_miss_in_red(missed: Path, tmp_path: Path) -> None:
    page = tmp_path / "postmortem.html"
    page.write_text(postmortemsvg.render_html(postmortem.load(missed, NOTICE)))
    pixels = list(png_pixels(screenshot(page, tmp_path / "postmortem.png")))
    assert len(pixels) == 1400 * 900

    def near(rgb: tuple[int, int, int], hex_colour: str) -> bool:
        want = bytes.fromhex(hex_colour.removeprefix("#"))
        return all(abs(a - b) <= 6 for a, b in zip(rgb, want, strict=True))

    red = sum(1 for p in pixels if near(p, postmortemsvg.MISS_RED))
    amber = sum(1 for p in pixels if near(p, postmortemsvg.FAIL_AMBER))
    white = sum(1 for p in pixels if p == (255, 255, 255))
    assert red > 500  # three late bars and the legend swatch, not a stray pixel
    assert amber > 100
    assert white < len(pixels) * 0.97  # something was drawn
