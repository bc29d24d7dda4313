"""Pub/Sub slots, the pure side: which subscription a slot consumes, which slot Lease a replica
may take and why, the setting's validation, and what the source registry builds for it. The
Lease writes themselves run against the real apiserver in tests/e2e/test_pubsub_slots.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from reclaimd import config, handlers
from reclaimd.cluster import slots
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.kubeconfig import Connection
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.cluster.slots import RELEASED, SlotLease, lease_name, pick, why_free
from reclaimd.config import Settings
from reclaimd.handlers import running
from reclaimd.handlers.pubsub.settings import PubSubSettings
from reclaimd.handlers.pubsub.transport import PubSubSource, SlottedPubSubSource
from reclaimd.handlers.transport import Supplies
from reclaimd.intake import Admission
from reclaimd.model import Notice, utcnow

NOW = utcnow()
NOWHERE = Connection("https://127.0.0.1:1", ssl=False)  # never called: the writes are e2e


def alive(holder: str, age_s: float = 1.0, duration_s: float = 20.0) -> SlotLease:
    return SlotLease(holder, NOW - timedelta(seconds=age_s), duration_s, "7")


def nobody_dead(_holder: str) -> bool:
    return False


# --- names --------------------------------------------------------------------------------


def test_one_slot_is_the_shared_subscription_and_more_are_suffixed_from_zero() -> None:
    one = PubSubSettings(subscription="reclaimd-preemptions")
    assert one.slot_subscription(0) == "reclaimd-preemptions"
    three = PubSubSettings(subscription="reclaimd-preemptions", slots=3)
    assert [three.slot_subscription(i) for i in range(3)] == [
        "reclaimd-preemptions-0",
        "reclaimd-preemptions-1",
        "reclaimd-preemptions-2",
    ]
    with pytest.raises(ValueError, match=r"out of 0\.\.2"):
        three.slot_subscription(3)


def test_a_slot_lease_is_named_for_its_subscription() -> None:
    assert lease_name("reclaimd-preemptions-0") == "reclaimd-pubsub-slot-reclaimd-preemptions-0"
    # Valid in a subscription id, not in an object name: a digest, stable and distinct.
    odd = lease_name("Reclaimd_Preemptions-0")
    assert odd.startswith(slots.PREFIX) and len(odd) == len(slots.PREFIX) + 24
    assert odd == lease_name("Reclaimd_Preemptions-0") != lease_name("Reclaimd_Preemptions-1")
    assert len(lease_name("a" * 250)) <= 253


# --- the setting --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pubsub: {slots: 0}", "c.yaml: pubsub.slots: Input should be greater than or equal to 1"),
        ("pubsub: {slots: two}", "c.yaml: pubsub.slots: Input should be a valid integer"),
        (
            "pubsub: {slots: 2, subscription: " + "s" * 254 + "}",
            "c.yaml: pubsub: subscription: with its slot suffix longer than 255",
        ),
        (
            "dry_run: true\npubsub: {enabled: true, slots: 2, project: p, subscription: s}",
            "c.yaml: pubsub.slots: a dry run consumes one subscription",
        ),
    ],
)
def test_a_bad_slots_value_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(config.ConfigError) as e:
        config.load(path, env={})
    assert str(e.value).startswith(f"{path.parent}/{message}"), str(e.value)
    assert "\n" not in str(e.value)


def test_slots_default_to_one_and_take_an_environment_override() -> None:
    assert Settings().pubsub.slots == 1
    assert config.load(None, env={"RECLAIMD_PUBSUB__SLOTS": "2"}).pubsub.slots == 2


# --- which slot a replica may take ----------------------------------------------------------


def test_a_slot_is_free_when_absent_released_ours_dead_or_expired() -> None:
    assert why_free(None, "me", NOW, nobody_dead) == "new"
    assert why_free(SlotLease("", RELEASED, 1, "3"), "me", NOW, nobody_dead) == "released"
    assert why_free(SlotLease("peer", RELEASED, 1, "3"), "me", NOW, nobody_dead) == "released"
    assert why_free(alive("me"), "me", NOW, nobody_dead) == "own"
    assert why_free(alive("peer"), "me", NOW, lambda h: h == "peer") == "dead"
    assert why_free(alive("peer", age_s=21), "me", NOW, nobody_dead) == "expired"
    assert why_free(alive("peer", age_s=19), "me", NOW, nobody_dead) is None


def test_a_replica_tries_its_own_slot_first_then_the_free_ones_by_index() -> None:
    leases = {
        0: alive("peer"),
        1: None,
        2: SlotLease("gone", RELEASED, 1, "4"),
        3: alive("me"),
    }
    assert pick(leases, "me", NOW, nobody_dead) == [(3, "own"), (1, "new"), (2, "released")]
    # a surge pod while both replicas live: nothing to take, it waits
    held = {0: alive("a"), 1: alive("b")}
    assert pick(held, "surge", NOW, nobody_dead) == []
    # the peer probe found "a" dead: its slot is free now, not when its Lease runs out
    assert pick(held, "surge", NOW, lambda h: h == "a") == [(0, "dead")]


# --- what the registry builds -----------------------------------------------------------------


async def admit(notice: Notice) -> Admission:
    return Admission.CLAIMED


def pubsub_settings(**pubsub: object) -> Settings:
    return Settings.model_validate(
        {"pubsub": {"enabled": True, "project": "p", "subscription": "s", **pubsub}}
    )


async def test_one_slot_builds_the_plain_source_and_more_a_slotted_one() -> None:
    built = running.build(pubsub_settings(), admit=admit)
    assert isinstance(built["pubsub"], PubSubSource)
    assert running.slots(built) == {}  # no slot, no gauge

    async with ApiServer.open(NOWHERE) as api:
        supplies = Supplies(
            pubsub_settings(slots=2), admit, pubsub_settings().windows, api, limiter=object()
        )
        (entry,) = handlers.enabled(supplies.settings)
        slotted = running.build_one(entry, supplies)
        assert isinstance(slotted, SlottedPubSubSource)
        assert slotted.slots.subscriptions == ("s-0", "s-1")  # type: ignore[attr-defined]
        gauge = running.slots({"pubsub": slotted})["pubsub"]
        assert gauge.held() == -1  # none held yet
        assert gauge.help == SlottedPubSubSource.slot_help

    with pytest.raises(ValueError, match="needs the Kubernetes API"):
        running.build(pubsub_settings(slots=2), admit=admit)


# --- minding the free slots (the Lease reads faked; their writes are e2e) ------------------


async def test_free_slots_are_minded_left_to_a_live_holder_and_a_failed_guest_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(slots, "MIND_EVERY_S", 0.01)
    monkeypatch.setattr(slots, "MIND_AFTER_S", 0.05)
    leases: dict[int, SlotLease | None] = {0: None, 1: None, 2: None}
    started: list[int] = []
    cancelled: list[int] = []
    fail = {2}

    async def consume(index: int) -> None:
        started.append(index)
        if index in fail:
            fail.discard(index)
            raise RuntimeError("subscription gone")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(index)
            raise

    async def read_all() -> dict[int, SlotLease | None]:
        return dict(leases)

    async def until(check: Callable[[], bool]) -> None:
        for _ in range(500):
            if check():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("not reached")

    async with ApiServer.open(NOWHERE) as api:
        s = slots.PubSubSlots(
            api, "ns", "me", subscriptions=["s-0", "s-1", "s-2"], lease_s=20,
            limiter=RateLimiter(),
        )  # fmt: skip
        monkeypatch.setattr(s, "_read_all", read_all)
        s.held = 0
        leases[0] = SlotLease("me", utcnow(), 20.0, "7")
        minding = asyncio.create_task(s.mind(consume))
        try:
            # slot 2's guest fails once: logged, minded again, the others never stopped
            await until(lambda: s.minded == {1, 2} and started.count(2) == 2)
            assert started.count(1) == 1 and cancelled == []
            # a live replica holds slot 1 again (renewed now: NOW is the module's import time)
            leases[1] = SlotLease("peer", utcnow(), 20.0, "8")
            await until(lambda: s.minded == {2})
            assert cancelled == [1] and not minding.done()
        finally:
            minding.cancel()
            await asyncio.gather(minding, return_exceptions=True)
    assert sorted(cancelled) == [1, 2] and s.minded == set()
    assert 0 not in started  # its own slot is consumed by run(), never as a guest


# --- the drill rig ----------------------------------------------------------------------------


def test_a_two_replica_pubsub_drill_gives_each_replica_a_slot_subscription() -> None:
    from typing import Any, cast

    from chaos.drill import scenario
    from chaos.drill.run import Drill

    repo = Path(__file__).resolve().parents[2]
    two = scenario.load(repo / "chaos" / "scenarios" / "gce-kill-30s.yaml")
    assert two.reclaimd.replicas == 2
    drill = Drill(two, cast(Any, None), run_id="r1")
    drill.built.pubsub_subscription = "reclaimd-r1"
    assert drill.world.pubsub_slots == 2
    assert drill.world.pubsub_subscriptions() == ["reclaimd-r1-0", "reclaimd-r1-1"]

    one = two.model_copy(update={"reclaimd": two.reclaimd.model_copy(update={"replicas": 1})})
    alone = Drill(one, cast(Any, None), run_id="r1")
    alone.built.pubsub_subscription = "reclaimd-r1"
    assert alone.world.pubsub_slots == 1
    assert alone.world.pubsub_subscriptions() == ["reclaimd-r1"]  # today's plain subscription


def test_terraform_makes_the_subscriptions_the_slots_consume() -> None:
    """deploy/gcp/main.tf: one subscription per replica, named as ``slot_subscription``."""
    repo = Path(__file__).resolve().parents[2]
    tf = (repo / "deploy" / "gcp" / "main.tf").read_text()
    assert "count   = var.replicas" in tf
    assert 'name    = var.replicas == 1 ? var.name : "${var.name}-${count.index}"' in tf
    names = {n: PubSubSettings(subscription="x", slots=n) for n in (1, 2)}
    assert names[1].slot_subscription(0) == "x"  # var.name
    assert names[2].slot_subscription(1) == "x-1"  # "${var.name}-${count.index}"
