"""reclaimd's Kafka clients against the stack's production-shaped listeners.

The broker (deploy/local/kafka/server.properties.in) serves SASL_SSL (SCRAM-SHA-512 user
``reclaimd``, a CA made at stack-up) and SSL with a client certificate required, with ACLs:
``User:reclaimd`` may write and read its ledger topics, read the notices topics, and nothing
else. The rig reads and writes as a super user over PLAINTEXT. Each listener carries the
ledger, the notices and the report; each refusal (a wrong password, an untrusted broker, an
expired client certificate, an ACL) names itself once, keeps every event in the outbox, and
is mended by a restart with the setting fixed: nothing lost, nothing doubled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_ledger_kafka import read_all, waste

from chaos import inject
from chaos import stack as stackenv
from chaos.harness import Harness, readyz
from chaos.ports import free_port
from reclaimd.handlers.kafka_notices.settings import KafkaNoticeSettings
from reclaimd.handlers.kafka_notices.transport import KafkaNoticeSource
from reclaimd.intake import Admission
from reclaimd.kafkaconn import KafkaSettings
from reclaimd.ledger.writer import LedgerWriter
from reclaimd.model import Notice, Windows
from reclaimd.settings.ledger import LedgerWriterSettings

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RATES = REPO / "chaos" / "demo-rates.csv"
LISTENERS = ("sasl_ssl", "ssl")
GANGS = ["jobset:team-a/llm", "jobset:team-a/vit"]


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with Harness(stackenv.load()) as harness:
        yield harness


def _settings(listener: stackenv.KafkaListener, **changes: Any) -> KafkaSettings:
    data = json.loads(json.dumps(listener.settings))
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = data
        for part in path:
            node = node[part]
        node[last] = value
    return KafkaSettings.model_validate(data)


async def _ledger_topic(h: Harness, prefix: str = "reclaimd.restart-waste") -> str:
    topic = f"{prefix}.sec-{uuid.uuid4().hex[:10]}"
    await h.create_topics({topic: 1})
    return topic


def _writer(
    listener: stackenv.KafkaListener, kafka: KafkaSettings, topic: str, outbox: Path
) -> LedgerWriter:
    return LedgerWriter(
        bootstrap_servers=listener.bootstrap,
        connection=kafka,
        topic=topic,
        outbox_path=outbox,
        tuning=LedgerWriterSettings(
            backoff_initial_s=0.2, backoff_max_s=1.0, request_timeout_ms=5000
        ),
    )


async def _until(check: Any, timeout_s: float, what: str) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{what} not reached in {timeout_s}s")


@pytest.mark.parametrize("name", LISTENERS)
async def test_ledger_notices_and_report_over_the_listener(
    h: Harness, tmp_path: Path, name: str
) -> None:
    listener = h.stack.kafka_as_reclaimd(name)
    kafka = _settings(listener)
    topic = await _ledger_topic(h)

    # The ledger: two events, one transaction, read back by the rig.
    writer = _writer(listener, kafka, topic, tmp_path / "o.sqlite")
    await writer.record(waste("n-1", "llm"))
    await writer.record(waste("n-2", "vit"))
    async with writer:
        assert await writer.flush(60), writer.kafka_problem
    assert writer.kafka_problem is None
    records = await read_all(h.stack.kafka, topic, expect=2)
    assert sorted(json.loads(r.value)["x_GangId"] for r in records) == GANGS

    # The notices: a CloudEvent the rig produced, consumed as User:reclaimd in its group.
    notices = await h.notices_topic()
    node = h.node_spec(0)
    await inject.produce_kafka(
        h.stack.kafka,
        notices,
        inject.cloudevent_notice(
            "spot_interruption", {"node_name": node.name, "provider_id": node.provider_id}
        ),
    )
    seen: list[Notice] = []

    async def admit(notice: Notice) -> Admission:
        seen.append(notice)
        return Admission.CLAIMED

    source = KafkaNoticeSource(
        KafkaNoticeSettings(
            enabled=True,
            bootstrap=listener.bootstrap,
            topic=notices,
            group_id=f"reclaimd-{h.run_id}",
        ),
        admit=admit,
        windows=Windows(),
        kafka=kafka,
    )
    run = asyncio.create_task(source.run())
    try:
        await _until(lambda: len(seen) == 1, 60, "the notice consumed")
    finally:
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    assert source.problem is None
    assert seen[0].target.node_name == node.name

    # The report, as an operator runs it: the settings file's kafka section.
    config = tmp_path / "reclaimd.yaml"
    config.write_text(yaml.safe_dump({"kafka": listener.settings}))
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "reclaimd.cli", "report", "--config", str(config),
         "--ledger", f"kafka://{listener.bootstrap}/{topic}", "--rates", str(RATES),
         "--format", "json"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows, out.stdout
    assert "acme" in out.stdout  # the events' tenant


# What each refusal must say (and no secret): the listener, the change, the words.
REFUSALS = {
    "wrong_password": ("sasl_ssl", "password", "SASL: authentication failed for user reclaimd"),
    "unknown_ca": ("sasl_ssl", "other_ca", "TLS: the broker's certificate is not trusted"),
    "expired_certificate": ("ssl", "expired", "TLS: the broker refused our client certificate"),
    "acl_denied": ("sasl_ssl", "acl", "ACL: the broker denies user reclaimd on the topic"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
async def test_a_refused_setting_says_why_keeps_events_and_a_fixed_restart_publishes_once(
    h: Harness, tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    listener_name, change, says = REFUSALS[case]
    listener = h.stack.kafka_as_reclaimd(listener_name)
    pki = Path(h.stack["KAFKA_PKI_DIR"])
    good = _settings(listener)
    topic = await _ledger_topic(h)
    bad, bad_topic = good, topic
    secret = (pki / "reclaimd.password").read_text().strip()
    if change == "password":
        wrong = tmp_path / "wrong.password"
        wrong.write_text("not-" + secret)
        bad = _settings(listener, sasl__password_file=str(wrong))
    elif change == "other_ca":
        bad = _settings(listener, tls__ca_file=str(pki / "other-ca.crt"))
    elif change == "expired":
        bad = _settings(
            listener,
            tls__cert_file=str(pki / "expired-client.crt"),
            tls__key_file=str(pki / "expired-client.key"),
        )
    else:  # a topic outside reclaimd's ACLs
        bad_topic = await _ledger_topic(h, prefix="forbidden.ledger")

    outbox = tmp_path / "o.sqlite"
    writer = _writer(listener, bad, bad_topic, outbox)
    await writer.record(waste("n-1", "llm"))
    await writer.record(waste("n-2", "vit"))
    caplog.set_level(logging.INFO, logger="reclaimd")
    async with writer:
        await _until(lambda: writer.kafka_problem is not None, 60, "the problem named")
        assert writer.kafka_problem is not None
        assert writer.kafka_problem.startswith(says), writer.kafka_problem
        assert writer.depth() == 2  # both events wait in the outbox
    said = [r.getMessage() for r in caplog.records if "ledger cannot publish" in r.getMessage()]
    assert len(said) == 1, said  # once per problem, not once per retry
    assert secret not in caplog.text
    if change == "password":
        assert "not-" + secret not in caplog.text

    # Mended and restarted on the same outbox: each event exactly once on the ledger topic.
    fixed = _writer(listener, good, topic, outbox)
    async with fixed:
        assert await fixed.flush(60), fixed.kafka_problem
    assert fixed.depth() == 0 and fixed.kafka_problem is None
    records = await read_all(h.stack.kafka, topic, expect=2)
    assert sorted(json.loads(r.value)["x_GangId"] for r in records) == GANGS
    if bad_topic != topic:
        await read_all(h.stack.kafka, bad_topic, expect=0)


def _read(path: str) -> str:
    return Path(path).read_text().strip()


async def test_a_replica_refused_by_kafka_is_not_ready_and_a_fixed_restart_publishes_once(
    h: Harness, tmp_path: Path
) -> None:
    """The whole replica (``reclaimd run``): a wrong password makes /readyz name the kafka
    check and the log say why once; the notice is handled and its event waits; restarted with
    the right password, the same outbox publishes it once."""
    good = h.replica_kafka.settings
    assert good.get("security_protocol") == "SASL_SSL", "the rig's replicas run over SASL_SSL"
    secret = _read(good["sasl"]["password_file"])
    wrong = tmp_path / "wrong.password"
    wrong.write_text("wrong-" + secret)
    node = h.node_spec(0)
    await h.add_nodes([node])
    gang = await h.add_gang("sec", [node.name])
    port = free_port()
    bad = {**good, "sasl": {**good["sasl"], "password_file": str(wrong)}}
    first = await h.start_daemon(kafka=bad, metrics_port=port)

    async def answers(expected: tuple[int, str]) -> bool:
        return await asyncio.to_thread(readyz, port) == expected

    await _until_async(lambda: answers((503, "not ready: kafka")), 90, "/readyz names kafka")
    notice = h.send_spot(node)
    await h.wait_phase(node.name, "done")
    assert await h.pods_left([gang.pod_name(0)]) == []
    assert await answers((503, "not ready: kafka"))  # the event is held, still not ready
    await first.stop()
    log = first.log_path.read_text()
    said = [line for line in log.splitlines() if "ledger cannot publish" in line]
    assert len(said) == 1, said
    assert "SASL: authentication failed for user reclaimd" in said[0]
    assert secret not in log

    before = len(log)  # the restarted process logs on in the same file
    second = await h.start_daemon(metrics_port=port)  # same holder, same outbox, mended
    events = await h.ledger_events(count=1, timeout_s=90, settle_s=2.0)
    assert [e["x_NoticeId"] for e in events] == [notice.id]
    await _until_async(lambda: answers((200, "ok")), 60, "ready once mended")
    assert "ledger cannot publish" not in _read(str(second.log_path))[before:]


async def _until_async(check: Any, timeout_s: float, what: str) -> None:
    for _ in range(int(timeout_s / 0.2)):
        if await check():
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{what} not reached in {timeout_s}s")
