import asyncio
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from reclaimd.outbox import AsyncOutbox, Outbox

H = (("event_id", b"e1"), ("traceparent", b"\x00\xff binary-safe"))


def test_put_is_idempotent_on_the_id(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    assert box.put("e1", b"k", b"v1", H) is True
    assert box.put("e1", b"k", b"v2-ignored", H) is False
    rows = box.pending()
    assert [(r.id, r.key, r.value, r.headers) for r in rows] == [("e1", b"k", b"v1", H)]
    assert box.depth() == 1


def test_pending_is_in_insertion_order_and_limited(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    for i in (3, 1, 2):
        box.put(f"e{i}", None, b"v", ())
    assert [r.id for r in box.pending(limit=2)] == ["e3", "e1"]
    assert box.pending(limit=10)[0].key is None


def test_mark_sent_removes_from_pending_and_the_id_stays_taken(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    box.put("e1", b"k", b"v", ())
    box.put("e2", b"k", b"v", ())
    assert box.mark_sent(["e1", "nope"]) == 1
    assert box.mark_sent(["e1"]) == 0
    assert [r.id for r in box.pending()] == ["e2"]
    assert box.depth() == 1
    # Sent is not forgotten: a replay of the same event is still a no-op.
    assert box.put("e1", b"k", b"v", ()) is False
    assert box.depth() == 1


def test_prune_forgets_only_old_sent_rows(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    box.put("sent", b"k", b"v", ())
    box.put("unsent", b"k", b"v", ())
    box.mark_sent(["sent"])
    assert box.prune(older_than_s=3600) == 0
    assert box.prune(older_than_s=-1) == 1
    assert box.contains("unsent") and not box.contains("sent")


def test_reopen_finds_rows_and_depth(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite"
    box = Outbox(path)
    box.put("e1", b"k", b"v", H)
    box.put("e2", b"k", b"v", H)
    box.mark_sent(["e1"])
    box.close()
    again = Outbox(path)
    assert again.depth() == 1
    assert [r.id for r in again.pending()] == ["e2"]
    assert again.put("e1", b"k", b"v", ()) is False


def test_journal_is_wal(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite"
    Outbox(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_rows_survive_a_process_that_dies_without_closing(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite"
    child = textwrap.dedent(
        f"""
        import os
        from reclaimd.outbox import Outbox
        box = Outbox({str(path)!r})
        for i in range(5):
            box.put(f"e{{i}}", b"k", b"v", [("event_id", b"x")])
        os._exit(0)  # no close, no atexit: what a crash leaves behind
        """
    )
    subprocess.run([sys.executable, "-c", child], check=True, timeout=60)
    box = Outbox(path)
    assert box.depth() == 5
    assert [r.id for r in box.pending()] == [f"e{i}" for i in range(5)]


async def test_async_outbox_serializes_concurrent_puts(tmp_path: Path) -> None:
    box = AsyncOutbox.open(tmp_path / "o.sqlite")
    results = await asyncio.gather(*(box.put(f"e{i % 10}", b"k", b"v", H) for i in range(40)))
    assert sum(results) == 10
    assert box.depth() == 10
    rows = await box.pending(100)
    assert await box.mark_sent([r.id for r in rows]) == 10
    assert box.depth() == 0
    assert await box.contains("e3")
    await box.close()
