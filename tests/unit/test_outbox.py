import asyncio
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from reclaimd import outbox
from reclaimd.outbox import AsyncOutbox, Cluster, Outbox

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


def test_cluster_state_and_tries_are_kept_and_pending_rows_wait(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    box.put("e1", b"k", b"v", (), Cluster.PENDING)
    box.put("e2", b"k", b"v", (), Cluster.HELD)
    # A row whose cluster write is still running is not published yet.
    assert [(r.id, r.cluster, r.tried) for r in box.pending()] == [("e2", Cluster.HELD, False)]
    box.set_cluster("e1", Cluster.UNKNOWN)
    box.mark_tried(["e2"])
    assert [(r.id, r.cluster, r.tried) for r in box.pending()] == [
        ("e1", Cluster.UNKNOWN, False),
        ("e2", Cluster.HELD, True),
    ]
    assert box.depth() == 2
    got = box.get("e2")
    assert got is not None and got[0].tried and got[1] is False
    box.mark_sent(["e2"])
    got = box.get("e2")
    assert got is not None and got[1] is True
    assert box.get("nope") is None


def test_unknown_cluster_state_is_refused(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    with pytest.raises(ValueError, match="cluster state"):
        box.put("e1", None, b"v", (), "maybe")


def test_a_put_cut_off_mid_cluster_write_is_in_doubt_after_reopen(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite"
    box = Outbox(path)
    box.put("e1", None, b"v", (), Cluster.PENDING)
    box.close()
    again = Outbox(path)
    assert [(r.id, r.cluster) for r in again.pending()] == [("e1", Cluster.UNKNOWN)]


def test_a_file_from_before_the_cluster_columns_opens_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE outbox (
            seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, key BLOB,
            value BLOB NOT NULL, headers TEXT NOT NULL, created_at REAL NOT NULL, sent_at REAL
        );
        INSERT INTO outbox (id, key, value, headers, created_at) VALUES ('old', NULL, 'v', '[]', 1);
        """
    )
    db.close()
    box = Outbox(path)
    assert [(r.id, r.cluster, r.tried, r.created_at) for r in box.pending()] == [
        ("old", Cluster.NONE, False, 1.0)
    ]
    assert box.depth() == 1


def test_a_row_left_to_a_peer_waits_outside_depth_until_settled(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    box.put("mine", None, b"v", (), Cluster.HELD)
    box.put("theirs", None, b"v", (), Cluster.PENDING)
    box.set_cluster("theirs", Cluster.PEER)  # a peer held the record: it publishes
    assert [r.id for r in box.pending()] == ["mine"]
    assert box.peers() == ["theirs"]
    assert box.depth() == 1
    # The peer published it (its record is gone): settled, and depth does not move again.
    assert box.mark_sent(["theirs"]) == 0
    got = box.get("theirs")
    assert got is not None and got[1] is True
    assert box.peers() == [] and box.depth() == 1


def test_a_peer_row_stays_outside_depth_after_reopen(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite"
    box = Outbox(path)
    box.put("theirs", None, b"v", (), Cluster.PEER)
    box.put("mine", None, b"v", (), Cluster.NONE)
    assert box.depth() == 1
    box.close()
    again = Outbox(path)
    assert again.depth() == 1 and again.peers() == ["theirs"]


@pytest.mark.parametrize("before", ["peer", "sent", "absent"])
def test_adopting_a_record_publishes_the_record_s_copy(tmp_path: Path, before: str) -> None:
    """Whatever this outbox held under the id (a copy left to a dead peer, a copy marked sent
    on a peer's word, nothing), the adopted record's event is what gets published."""
    box = Outbox(tmp_path / "o.sqlite")
    if before != "absent":
        box.put("e1", b"k", b"our-second-charge", (), Cluster.PEER)
    if before == "sent":
        box.mark_sent(["e1"])
    box.adopt("e1", b"k", b"the-dead-peer-s-charge", H)
    assert [(r.id, r.value, r.cluster, r.headers) for r in box.pending()] == [
        ("e1", b"the-dead-peer-s-charge", Cluster.HELD, H)
    ]
    assert box.depth() == 1 and box.peers() == []
    box.adopt("e1", b"k", b"the-dead-peer-s-charge", H)  # a second pass: no change
    assert box.depth() == 1


def test_oldest_age_is_the_oldest_event_still_ours_to_publish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reclaimd_ledger_outbox_oldest_age_seconds: what the alert on an unpublished ledger reads."""
    now = [1000.0]
    monkeypatch.setattr(outbox, "time", SimpleNamespace(time=lambda: now[0]))
    path = tmp_path / "o.sqlite"
    box = Outbox(path)
    assert box.oldest_age_s() == 0.0  # nothing waits
    box.put("theirs", None, b"v", (), Cluster.PEER)  # a peer publishes it: not ours to wait on
    assert box.oldest_age_s() == 0.0
    now[0] = 1010.0
    box.put("e1", None, b"v", (), Cluster.PENDING)
    now[0] = 1020.0
    box.put("e2", None, b"v", ())
    box.set_cluster("e1", Cluster.HELD)
    now[0] = 1050.0
    assert box.oldest_age_s() == 40.0  # e1, put at 1010
    box.mark_sent(["e1"])
    assert box.oldest_age_s() == 30.0  # e2 now
    box.close()
    again = Outbox(path)  # the age survives a restart: it is the row's, not the process's
    assert again.oldest_age_s() == 30.0
    again.set_cluster("e2", Cluster.PEER)  # left to a peer: none of ours waits
    assert again.oldest_age_s() == 0.0
    again.adopt("theirs", None, b"v", ())  # the dead peer's row, ours now since 1000
    assert again.oldest_age_s() == 50.0
    again.mark_sent(["theirs"])
    assert again.oldest_age_s() == 0.0
