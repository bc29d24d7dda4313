import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reclaimd.cluster.ledgerlog import PendingEvent
from reclaimd.ledger.event import (
    SCHEMA,
    encode,
    instance_part,
    kafka_key,
    record_event_id,
    to_event,
)
from reclaimd.ledger.fencing import transactional_id
from reclaimd.ledger.labels import (
    LabelPolicy,
    cost_labels,
    normalize_purchase_option,
    placement,
    pricing_category,
)
from reclaimd.ledger.records import settle
from reclaimd.ledger.writer import LedgerWriter
from reclaimd.model import (
    CheckpointScope,
    Gang,
    GangKey,
    Member,
    Notice,
    NoticeKind,
    RankAck,
    RestartWaste,
    Target,
    frozen_map,
)
from reclaimd.outbox import Cluster, Outbox, Row
from reclaimd.waste import build_restart_waste, with_placements

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def make_waste(
    labels: dict[str, str] | None = None,
    *,
    traceparent: str = TRACEPARENT,
    gang_name: str = "llm",
    attributes: dict[str, str] | None = None,
    placements: dict[str, dict[str, str]] | None = None,
) -> RestartWaste:
    n = Notice(
        id="aws-abc",
        source="aws.sqs",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(instance_id="i-0abc", node_name="ip-10-0-0-1"),
        issued_at=T0,
        deadline=T0 + timedelta(seconds=120),
        received_at=T0 + timedelta(seconds=2),
        attributes=frozen_map(
            attributes
            if attributes is not None
            else {"region": "us-east-1", "zone": "us-east-1a", "instance_type": "p5.48xlarge"}
        ),
    )
    ms = tuple(
        Member(
            namespace="team-a",
            name=f"llm-worker-{i}",
            uid=f"u{i}",
            node=f"node-{i % 2}",
            gpus=8,
            checkpoint_url="http://10.0.0.1/c",
            last_checkpoint=T0 - timedelta(minutes=30),
        )
        for i in range(3)
    )
    g = Gang(
        GangKey("jobset", "team-a", gang_name),
        ms,
        CheckpointScope.RANK,
        frozen_map(
            labels
            if labels is not None
            else {
                "tenant": "acme",
                "queue": "research",
                "sku": "p5.48xlarge",
                "cell": "use1-a",
                "purchase_option": "spot",
            }
        ),
    )
    acks = [RankAck(member=ms[0], acked=True, durable=True, checkpoint_time=T0)]
    return build_restart_waste(
        n,
        g,
        acks,
        T0 + timedelta(seconds=100),
        deadline_met=True,
        traceparent=traceparent,
        cluster="prod-use1",
        placements=placements,
    )


# --- label policy ----------------------------------------------------------------------


def test_pii_and_unknown_keys_are_dropped_and_counted_not_raised() -> None:
    p = LabelPolicy()
    tags = p.tags(
        {
            "tenant": "acme",
            "prompt": "tell me a secret",
            "user_email": "a@b.c",
            "session_raw": "xyz",
            "team": "infra",
        }
    )
    assert tags == {"tenant": "acme"}
    assert p.dropped["refused_key"] == 4


def test_allowlist_cannot_open_a_pii_key() -> None:
    p = LabelPolicy(allowed=["tenant", "prompt"])
    assert p.tags({"prompt": "x", "tenant": "t"}) == {"tenant": "t"}
    assert p.dropped["refused_key"] == 1


def test_configured_allowlist_narrows_tags() -> None:
    p = LabelPolicy(allowed=["tenant"])
    assert p.tags({"tenant": "t", "queue": "q"}) == {"tenant": "t"}


@pytest.mark.parametrize(
    "value", ["", "x" * 64, "has space", "ümlaut", "a/b", "semi;colon", "line\nbreak"]
)
def test_bad_values_are_dropped_and_counted(value: str) -> None:
    p = LabelPolicy()
    assert p.tags({"queue": value, "tenant": "ok"}) == {"tenant": "ok"}
    assert p.dropped["bad_value"] == 1


def test_value_at_the_limit_is_kept() -> None:
    p = LabelPolicy()
    assert p.tags({"queue": "q" * 63}) == {"queue": "q" * 63}
    assert sum(p.dropped.values()) == 0


def test_mig_profile_is_a_fact_not_a_refused_tag() -> None:
    p = LabelPolicy()
    assert p.tags({"mig_profile": "1g.10gb"}) == {}
    assert sum(p.dropped.values()) == 0


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("spot", "spot"),
        ("SPOT", "spot"),
        ("on-demand", "on_demand"),
        ("ON_DEMAND", "on_demand"),
        ("reserved", "reserved"),
        ("CAPACITY_BLOCK", "capacity_block"),
        ("capacity-block", "capacity_block"),
        ("preemptible", "spot"),
        ("bid", None),
        ("", None),
        (None, None),
    ],
)
def test_purchase_option_normalization(raw: str | None, want: str | None) -> None:
    assert normalize_purchase_option(raw) == want


@pytest.mark.parametrize(
    ("opt", "cat"),
    [
        ("spot", "Dynamic"),
        ("on_demand", "Standard"),
        ("reserved", "Committed"),
        ("capacity_block", "Committed"),
        ("weird", "Other"),
        (None, "Other"),
    ],
)
def test_pricing_category(opt: str | None, cat: str) -> None:
    assert pricing_category(opt) == cat


# --- cost_labels -----------------------------------------------------------------------


def test_cost_labels_from_pod_and_node() -> None:
    pod = {
        "reclaimd.io/tenant": "acme",
        "kueue.x-k8s.io/queue-name": "lq-research",
        "reclaimd.io/cell": "cell-7",
        "app": "trainer",
    }
    node = {
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "karpenter.sh/capacity-type": "on-demand",
    }
    assert cost_labels(pod, node) == {
        "tenant": "acme",
        "queue": "lq-research",
        "cell": "cell-7",
        "sku": "p5.48xlarge",
        "purchase_option": "on_demand",
    }


def test_explicit_reclaimd_labels_win() -> None:
    pod = {"reclaimd.io/queue": "explicit", "kueue.x-k8s.io/queue-name": "kueue"}
    node = {"reclaimd.io/purchase-option": "reserved", "karpenter.sh/capacity-type": "spot"}
    got = cost_labels(pod, node)
    assert got["queue"] == "explicit"
    assert got["purchase_option"] == "reserved"


@pytest.mark.parametrize(
    ("node", "want"),
    [
        ({"eks.amazonaws.com/capacityType": "CAPACITY_BLOCK"}, "capacity_block"),
        ({"eks.amazonaws.com/capacityType": "SPOT"}, "spot"),
        ({"cloud.google.com/gke-spot": "true"}, "spot"),
        ({"cloud.google.com/gke-spot": "false"}, None),
        ({"kubernetes.azure.com/scalesetpriority": "spot"}, "spot"),
        ({"kubernetes.azure.com/scalesetpriority": "regular"}, None),
        ({"karpenter.sh/capacity-type": "mystery"}, None),
    ],
)
def test_purchase_option_sources(node: dict[str, str], want: str | None) -> None:
    assert cost_labels({}, node).get("purchase_option") == want


def test_cell_falls_back_to_the_node_and_mig_profile_is_read() -> None:
    node = {"reclaimd.io/cell": "node-cell", "nvidia.com/mig.config": "all-1g.10gb"}
    got = cost_labels({}, node)
    assert got["cell"] == "node-cell"
    assert got["mig_profile"] == "all-1g.10gb"
    assert "mig_profile" not in cost_labels({}, {"nvidia.com/mig.config": "all-disabled"})


# --- event -----------------------------------------------------------------------------

REQUIRED = {
    "schema",
    "EventId",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ChargeCategory",
    "PricingCategory",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ResourceId",
    "ResourceType",
    "SkuId",
    "RegionId",
    "AvailabilityZone",
    "Tags",
    "x_WastedGpuSeconds",
    "x_GangId",
    "x_GangSize",
    "x_GpuCount",
    "x_MigProfile",
    "x_NoticeId",
    "x_NoticeSource",
    "x_NoticeKind",
    "x_NoticeReason",
    "x_NoticeWindowS",
    "x_NoticeReceivedAt",
    "x_NoticeDeadline",
    "x_CheckpointOutcome",
    "x_DeadlineMet",
    "x_K8sClusterName",
    "x_K8sNamespaceName",
    "x_K8sNodeNames",
    "x_TraceParent",
    "x_WasteByInstance",
}


def test_event_has_every_column_with_the_right_values() -> None:
    w = make_waste()
    ev = to_event(w, LabelPolicy())
    assert set(ev) == REQUIRED
    # rank 0 acked at T0 (100 s lost), ranks 1 and 2 from T0-30min (1900 s each), 8 GPUs each.
    wasted = 8 * 100 + 2 * 8 * 1900
    assert ev["x_WastedGpuSeconds"] == wasted
    assert ev["ConsumedQuantity"] == round(wasted / 3600, 6)
    assert ev["ConsumedUnit"] == "GPU-Hours"
    assert ev["schema"] == SCHEMA == "reclaimd.restart-waste/v2"
    assert ev["ChargePeriodStart"] == "2026-03-01T11:30:00Z"
    assert ev["ChargePeriodEnd"] == "2026-03-01T12:01:40Z"
    assert ev["ChargeCategory"] == "Usage"
    assert ev["PricingCategory"] == "Dynamic"
    assert ev["ResourceId"] == "i-0abc"
    assert ev["SkuId"] == "p5.48xlarge"
    assert (ev["RegionId"], ev["AvailabilityZone"]) == ("us-east-1", "us-east-1a")
    assert ev["Tags"] == {
        "cell": "use1-a",
        "purchase_option": "spot",
        "queue": "research",
        "sku": "p5.48xlarge",
        "tenant": "acme",
    }
    assert ev["x_GangId"] == "jobset:team-a/llm"
    assert (ev["x_GangSize"], ev["x_GpuCount"]) == (3, 24)
    assert ev["x_NoticeWindowS"] == 120.0
    assert ev["x_NoticeDeadline"] == "2026-03-01T12:02:00Z"
    assert ev["x_NoticeReceivedAt"] == "2026-03-01T12:00:02Z"
    assert ev["x_CheckpointOutcome"] == "partial"
    assert ev["x_DeadlineMet"] is True
    assert ev["x_K8sClusterName"] == "prod-use1"
    assert ev["x_K8sNamespaceName"] == "team-a"
    assert ev["x_K8sNodeNames"] == ["node-0", "node-1"]
    assert ev["x_TraceParent"] == TRACEPARENT
    assert ev["EventId"] == w.event_id


# --- waste priced where it happened (v2) ----------------------------------------------


def test_without_placements_the_split_falls_back_to_the_gang_labels() -> None:
    ev = to_event(make_waste(), LabelPolicy())
    parts = ev["x_WasteByInstance"]
    # node-0 ran rank 0 (acked at T0: 100 s) and rank 2 (1900 s); node-1 ran rank 1 (1900 s)
    assert [(p["x_K8sNodeName"], p["x_Ranks"], p["x_GpuCount"]) for p in parts] == [
        ("node-0", 2, 16),
        ("node-1", 1, 8),
    ]
    assert [p["x_WastedGpuSeconds"] for p in parts] == [8 * 100 + 8 * 1900, 8 * 1900]
    assert sum(p["x_WastedGpuSeconds"] for p in parts) == ev["x_WastedGpuSeconds"]
    for p in parts:
        assert p["x_PlacementSource"] == "gang"
        assert p["ResourceId"] is None  # the gang does not know its nodes' instances
        assert (p["SkuId"], p["x_PurchaseOption"], p["PricingCategory"]) == (
            "p5.48xlarge",
            "spot",
            "Dynamic",
        )
        assert (p["AvailabilityZone"], p["x_Cell"]) == ("us-east-1a", "use1-a")


def test_a_gang_across_spot_and_on_demand_is_split_by_instance() -> None:
    w = make_waste(
        placements={
            "node-0": {
                "instance_id": "i-0spot",
                "sku": "p5.48xlarge",
                "purchase_option": "spot",
                "zone": "us-east-1a",
                "cell": "c1",
            },
            "node-1": {
                "instance_id": "i-1od",
                "sku": "p4d.24xlarge",
                "purchase_option": "on_demand",
                "zone": "us-east-1b",
            },
            "elsewhere": {"instance_id": "i-not-this-gang"},
        }
    )
    assert set(w.placements) == {"node-0", "node-1"}  # only the gang's own nodes are kept
    parts = {p["x_K8sNodeName"]: p for p in to_event(w, LabelPolicy())["x_WasteByInstance"]}
    spot, od = parts["node-0"], parts["node-1"]
    assert (spot["ResourceId"], spot["PricingCategory"], spot["x_Cell"]) == (
        "i-0spot",
        "Dynamic",
        "c1",
    )
    assert (od["ResourceId"], od["SkuId"], od["x_PurchaseOption"], od["PricingCategory"]) == (
        "i-1od",
        "p4d.24xlarge",
        "on_demand",
        "Standard",
    )
    assert od["x_Cell"] is None  # a fact the node lacks is not borrowed from the gang
    assert od["AvailabilityZone"] == "us-east-1b"
    assert spot["x_PlacementSource"] == od["x_PlacementSource"] == "node"
    assert (spot["x_WastedGpuSeconds"], od["x_WastedGpuSeconds"]) == (16000, 15200)


def test_placement_reads_node_labels_and_the_provider_id() -> None:
    labels = {
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "karpenter.sh/capacity-type": "on-demand",
        "topology.kubernetes.io/zone": "us-east-2a",
        "reclaimd.io/cell": "use2-cell-1",
        "team": "not a cost fact",
    }
    assert placement(labels, "aws:///us-east-2a/i-0abc") == {
        "instance_id": "i-0abc",
        "sku": "p5.48xlarge",
        "purchase_option": "on_demand",
        "zone": "us-east-2a",
        "cell": "use2-cell-1",
    }
    # no providerID: the instance-id label; an unbounded value is dropped, not kept
    got = placement({"alpha.eksctl.io/instance-id": "i-9", "topology.kubernetes.io/zone": "a b"})
    assert got == {"instance_id": "i-9"}
    assert placement({}, "gce://proj/us-central1-a/gke-node-1")["instance_id"] == "gke-node-1"


def test_placement_of_an_aks_spot_node() -> None:
    """An AKS node: its VM (``<scale set>_<instance>``, what Scheduled Events name) from the
    azure:// providerID, its VM size as the SKU, spot from the pool's priority label."""
    labels = {
        "node.kubernetes.io/instance-type": "Standard_ND96isr_H100_v5",
        "kubernetes.azure.com/scalesetpriority": "spot",
        "kubernetes.azure.com/agentpool": "spotgpu",
        "topology.kubernetes.io/zone": "eastus-1",
    }
    provider_id = (
        "azure:///subscriptions/8d1a5e3c-0f1b-4c2a-9e7d-2b6f4a1c9e00/resourceGroups"
        "/mc_gpu-rg_train-aks_eastus/providers/Microsoft.Compute/virtualMachineScaleSets"
        "/aks-spotgpu-12345678-vmss/virtualMachines/3"
    )
    assert placement(labels, provider_id) == {
        "instance_id": "aks-spotgpu-12345678-vmss_3",
        "sku": "Standard_ND96isr_H100_v5",
        "purchase_option": "spot",
        "zone": "eastus-1",
    }
    part = instance_part("n", placement(labels, provider_id), {}, ranks=1, gpus=8)
    assert (part["SkuId"], part["PricingCategory"], part["x_PurchaseOption"]) == (
        "Standard_ND96isr_H100_v5",
        "Dynamic",
        "spot",
    )


def test_with_placements_looks_up_each_node_and_survives_a_failing_lookup() -> None:
    asked: list[str] = []

    def lookup(node: str) -> dict[str, str]:
        asked.append(node)
        if node == "node-1":
            raise KeyError(node)
        return {"instance_id": f"i-{node}", "purchase_option": "spot"}

    base = make_waste()
    w = with_placements(lookup)(
        base.notice, base.gang, (), base.stopped_at, deadline_met=True, cluster="c"
    )
    assert asked == ["node-0", "node-1"]
    assert dict(w.placements) == {"node-0": {"instance_id": "i-node-0", "purchase_option": "spot"}}
    parts = {p["x_K8sNodeName"]: p for p in to_event(w, LabelPolicy())["x_WasteByInstance"]}
    assert parts["node-0"]["x_PlacementSource"] == "node"
    assert parts["node-1"]["x_PlacementSource"] == "gang"


def test_event_carries_no_pod_names_or_refused_values() -> None:
    w = make_waste({"tenant": "acme", "prompt": "SECRET-PROMPT", "user_email": "me@x.io"})
    _, key, value, headers = encode(w, LabelPolicy())
    text = value.decode() + key.decode() + repr(headers)
    for leak in ("llm-worker-", "SECRET-PROMPT", "me@x.io", "prompt", "user_email"):
        assert leak not in text


def test_bad_traceparent_and_free_text_attributes_become_null() -> None:
    w = make_waste(
        traceparent="not a trace",
        attributes={"region": "us east 1", "reason": "Preempted by someone <script>"},
    )
    ev = to_event(w, LabelPolicy())
    assert ev["x_TraceParent"] is None
    assert ev["RegionId"] is None
    assert ev["x_NoticeReason"] is None
    _, _, _, headers = encode(w, LabelPolicy())
    assert [h for h, _ in headers] == ["event_id", "schema"]


def test_unknown_purchase_option_prices_as_other_and_sku_falls_back() -> None:
    w = make_waste({"tenant": "acme"})
    ev = to_event(w, LabelPolicy())
    assert ev["PricingCategory"] == "Other"
    assert ev["SkuId"] == "p5.48xlarge"  # from the notice's instance type


def test_encoded_event_is_stable_json_with_headers() -> None:
    w = make_waste()
    eid, key, value, headers = encode(w, LabelPolicy())
    assert (eid, key, value) == encode(make_waste(), LabelPolicy())[:3]
    assert json.loads(value) == to_event(w, LabelPolicy())
    assert key == b"acme|jobset:team-a/llm"
    assert dict(headers) == {
        "event_id": eid.encode(),
        "schema": SCHEMA.encode(),
        "traceparent": TRACEPARENT.encode(),
    }


def test_kafka_key_is_bounded_and_still_unique() -> None:
    a = make_waste(gang_name="g" * 250 + "a")
    b = make_waste(gang_name="g" * 250 + "b")
    ka, kb = kafka_key(a, {"tenant": "acme"}), kafka_key(b, {"tenant": "acme"})
    assert len(ka) <= 200 and len(kb) <= 200
    assert ka != kb
    assert kafka_key(make_waste(), {}) == b"-|jobset:team-a/llm"


# --- writer without a broker -----------------------------------------------------------


async def test_writer_without_broker_keeps_events_once_in_the_outbox(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite"
    async with LedgerWriter(bootstrap_servers="", topic="t", outbox_path=path) as writer:
        await writer.record(make_waste())
        await writer.record(make_waste())  # same notice and gang: same event id
        await writer.record(make_waste(gang_name="other"))
        assert writer.depth() == 2
        assert not await writer.flush(0.05)
    box = Outbox(path)
    rows = box.pending()
    assert [r.id for r in rows] == [make_waste().event_id, make_waste(gang_name="other").event_id]
    assert json.loads(rows[0].value)["EventId"] == rows[0].id


# --- exactly once: which rows are ours to send --------------------------------------------


def row(id: str, cluster: str = Cluster.NONE, tried: bool = False) -> Row:
    return Row(1, id, None, b"v", (), cluster, tried, 0.0)


def held_by(id: str, holder: str) -> PendingEvent:
    return PendingEvent("n", "t", id, None, b"v", (), T0, holder, (holder,))


def test_settle_sends_our_rows_and_gives_adopted_ones_away() -> None:
    rows = [row("mine", Cluster.HELD), row("local"), row("adopted", Cluster.HELD)]
    records = {"mine": held_by("mine", "a"), "adopted": held_by("adopted", "b")}
    ours, doubt, gone = settle(rows, records, "a")
    assert [r.id for r in ours] == ["mine", "local"]
    assert doubt == []
    assert [r.id for r in gone] == ["adopted"]


def test_settle_doubts_tried_rows_and_records_that_vanished() -> None:
    rows = [
        row("tried", tried=True),  # a transaction carried it: it may have committed
        row("vanished", Cluster.HELD),  # a peer may have published it and deleted the record
        row("no-answer", Cluster.UNKNOWN),  # its record's write had no answer, and none exists
        row("answered-late", Cluster.UNKNOWN),  # it does exist: ours
        row("tried-adopted", Cluster.HELD, tried=True),  # adopted wins over tried
    ]
    records = {"answered-late": held_by("answered-late", "a"), "tried-adopted": held_by("x", "b")}
    ours, doubt, gone = settle(rows, records, "a")
    assert [r.id for r in ours] == ["answered-late"]
    assert [r.id for r in doubt] == ["tried", "vanished", "no-answer"]
    assert [r.id for r in gone] == ["tried-adopted"]


def test_settle_doubts_a_row_whose_record_it_holds_by_adoption() -> None:
    """failover-4020099555: the record's first holder published the event, then died before
    its record became a tombstone; the replica that adopted the record must look at the
    topic, not send its own row of the same event as if the record had always been its own."""
    adopted = PendingEvent("n", "t", "e", None, b"v", (), T0, "a", ("b", "a"))
    ours, doubt, gone = settle([row("e", Cluster.HELD)], {"e": adopted}, "a")
    assert (ours, [r.id for r in doubt], gone) == ([], ["e"], [])
    own = PendingEvent("n", "t", "e", None, b"v", (), T0, "a", ("a", "a"))  # an earlier life
    assert [r.id for r in settle([row("e", Cluster.HELD)], {"e": own}, "a")[0]] == ["e"]


def test_settle_without_cluster_rows_reads_no_records() -> None:
    ours, doubt, gone = settle([row("a"), row("b", tried=True)], None, "a")
    assert ([r.id for r in ours], [r.id for r in doubt], gone) == (["a"], ["b"], [])


def test_transactional_id_is_per_holder_and_topic_and_stable() -> None:
    ids = {transactional_id(h, t) for h in ("a", "b") for t in ("waste", "allocation")}
    assert len(ids) == 4
    assert transactional_id("a", "waste") == transactional_id("a", "waste")
    assert all(len(i) < 64 for i in ids)


def test_record_event_id_from_the_header_or_the_row() -> None:
    assert record_event_id([("schema", b"s"), ("event_id", b"e1")], b"{}") == "e1"
    assert record_event_id([], b'{"EventId": "e2"}') == "e2"
    assert record_event_id([], b"not json") is None
    assert record_event_id([], b'["EventId"]') is None
    assert record_event_id([], None) is None


async def test_writer_and_cluster_log_must_share_the_holder(tmp_path: Path) -> None:
    class Log:
        holder = "b"

    with pytest.raises(ValueError, match="holder"):
        LedgerWriter(
            bootstrap_servers="",
            topic="t",
            outbox_path=tmp_path / "o.sqlite",
            holder="a",
            cluster=Log(),  # type: ignore[arg-type]
        )


def test_only_a_record_that_can_never_be_written_lets_an_event_go_unlocked() -> None:
    from reclaimd.cluster import errors
    from reclaimd.cluster.ledgerlog import TooLarge
    from reclaimd.ledger.records import refused_for_good

    assert refused_for_good(TooLarge("over the limit"))
    assert refused_for_good(errors.Invalid("create lease", 422))
    assert refused_for_good(errors.NotFound("create lease", 404))  # no such namespace
    # an API server just restarted answers 403 (and 401) before its caches fill
    assert not refused_for_good(errors.Forbidden("create lease", 403))
    assert not refused_for_good(errors.Unauthorized("create lease", 401))
    assert not refused_for_good(errors.ServerError("create lease", 503))
    assert not refused_for_good(RuntimeError("anything else"))
