"""The stack's Pub/Sub emulator drops a stream once its subscriber is gone, as the real service
does, so what is published next reaches a live subscriber at once.

The Cloud SDK's emulator jar (0.8.20) mixes two grpc-java releases and failed at every stream
that closed (``NoSuchMethodError`` in ``ServerImpl``'s ``closedInternal``): it kept leasing
messages to the dead stream, each until its ack deadline ran out (10 s here), before a live
subscriber got it. ``deploy/local/pubsub/pubsub_emulator.sh`` runs it with one grpc-java
release on its classpath. These tests fail on the unfixed emulator.

A subscriber is reclaimd's own transport (``PubSubSource``: google-cloud-pubsub streaming
pull, 10 s leases) in a child process; it proves its stream open by admitting a first notice,
then is SIGKILLed (a lost node) or SIGTERMed (its stream cancelled, as the daemon stops). A
live ``PubSubSource`` here then gets each notice published afterwards, one at a time, well
within the ack deadline: a notice leased to the dead stream could not reach it before that
lease ran out."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from chaos import inject
from chaos import stack as stackenv
from reclaimd.handlers.pubsub.settings import PubSubSettings
from reclaimd.handlers.pubsub.transport import PubSubSource
from reclaimd.intake import Admission
from reclaimd.model import Notice, Windows

ACK_DEADLINE_S = 10  # the subscription's, and the transport's lease (lease_extension_s)
# A notice leased to a dead stream comes back no sooner than its lease runs out: half of it
# is far more than a live stream needs (tens of milliseconds on loopback) and far less than
# one lease.
DELIVERY_BOUND_S = ACK_DEADLINE_S / 2
NOTICES = 8  # published one by one after the kill: each is a fresh dispatch
CHILD_READY_S = 30.0

CHILD = """
import asyncio, signal, sys
from reclaimd.intake import Admission
from reclaimd.model import Windows
from reclaimd.handlers.pubsub.settings import PubSubSettings
from reclaimd.handlers.pubsub.transport import PubSubSource

async def admit(notice):
    print("admitted", notice.id, flush=True)
    return Admission.CLAIMED

async def main():
    settings = PubSubSettings(
        enabled=True, project=sys.argv[1], subscription=sys.argv[2], max_messages=4
    )
    run = asyncio.ensure_future(PubSubSource(settings, admit=admit, windows=Windows()).run())
    # SIGTERM as the daemon takes it: the source is cancelled and cancels its stream.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, run.cancel)
    try:
        await run
    except asyncio.CancelledError:
        print("stopped", flush=True)

asyncio.run(main())
"""


class Recorded:
    """The live subscriber's admission: when each notice came, by instance name."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.arrived: dict[str, asyncio.Event] = {}

    def expect(self, instance: str) -> asyncio.Event:
        return self.arrived.setdefault(instance, asyncio.Event())

    async def __call__(self, notice: Notice) -> Admission:
        for instance, event in self.arrived.items():
            if instance in notice.target.describe() + notice.target.provider_id:
                self.at.setdefault(instance, time.monotonic())
                event.set()
        return Admission.CLAIMED


def _entry(instance: str) -> dict[str, Any]:
    return inject.gce_log_entry(project="reclaimd-local", zone="us-central1-a", instance=instance)


@pytest.fixture
async def channel(stack: Any) -> AsyncIterator[inject.PubSubChannel]:
    project = stackenv.load().values["PUBSUB_PROJECT_ID"]
    name = f"reclaimd-emu-{uuid.uuid4().hex[:8]}"
    ch = await asyncio.to_thread(
        inject.PubSubChannel(project, name).create, ack_deadline_s=ACK_DEADLINE_S
    )
    yield ch
    await asyncio.to_thread(ch.delete)


async def _subscriber_child(channel: inject.PubSubChannel) -> asyncio.subprocess.Process:
    """A ``PubSubSource`` in a child process, returned once it admitted a notice (its stream is
    open at the emulator, and leased that notice)."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        channel.project,
        channel.name,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert child.stdout is not None
    await asyncio.to_thread(channel.publish, _entry(f"vm-first-{uuid.uuid4().hex[:6]}"))
    line = await asyncio.wait_for(child.stdout.readline(), CHILD_READY_S)
    assert line.startswith(b"admitted "), line
    return child


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
async def test_a_gone_subscribers_stream_gets_no_more_messages(
    channel: inject.PubSubChannel, how: str
) -> None:
    log = stackenv.load().dir / "logs" / "pubsub-emulator.log"
    log_from = log.stat().st_size if log.exists() else 0
    child = await _subscriber_child(channel)
    child.send_signal(getattr(signal, how))
    assert child.stdout is not None
    rest = await asyncio.wait_for(child.stdout.read(), 30)
    assert await child.wait() == (-signal.SIGKILL if how == "SIGKILL" else 0)
    if how == "SIGTERM":
        assert rest.endswith(b"stopped\n"), rest  # it cancelled its stream, then exited

    recorded = Recorded()
    settings = PubSubSettings(
        enabled=True, project=channel.project, subscription=channel.name, max_messages=4
    )
    live = PubSubSource(settings, admit=recorded, windows=Windows())
    run = asyncio.create_task(live.run())
    took: dict[str, float] = {}
    try:
        for i in range(NOTICES):
            instance = f"vm-after-{i}-{uuid.uuid4().hex[:6]}"
            arrived = recorded.expect(instance)
            sent = time.monotonic()
            await asyncio.to_thread(channel.publish, _entry(instance))
            try:
                await asyncio.wait_for(arrived.wait(), DELIVERY_BOUND_S)
            except TimeoutError:
                pytest.fail(
                    f"notice {i} of {NOTICES} (after {how} of the first subscriber) did not "
                    f"reach the live subscriber within {DELIVERY_BOUND_S:g} s: leased to the "
                    f"dead stream until its {ACK_DEADLINE_S} s deadline? reached so far: "
                    + ", ".join(f"{t:.2f}" for t in took.values())
                )
            took[instance] = recorded.at[instance] - sent
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    print(
        f"\nafter {how}: {NOTICES} notices, publish -> live subscriber "
        f"max {max(took.values()):.3f} s, each: " + " ".join(f"{t:.3f}" for t in took.values())
    )
    # The emulator closed the streams it was told of without the grpc mismatch's error.
    added = log.read_bytes()[log_from:] if log.exists() else b""
    assert b"NoSuchMethodError" not in added
