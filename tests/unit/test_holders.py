"""Our holder Lease: fresh, and whether it lapsed (a peer may have taken our claims over)."""

import asyncio
import signal
import socket
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from pydantic import ValidationError

from reclaimd.cluster import errors, probe
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.holders import (
    FIRST,
    GROUP_ANNOTATION,
    HOLDER_ANNOTATION,
    PROBE_ANNOTATION,
    HolderLeases,
    lease_name,
)
from reclaimd.cluster.kubeconfig import Connection
from reclaimd.cluster.probe import Listener
from reclaimd.model import utcnow

# Never called: every call goes to the fake write budget, which answers it.
NO_API = ApiServer(Connection("https://127.0.0.1:1", ssl=False), cast(Any, None))


class Accepting:
    """A write budget whose every write goes through (no API server needed)."""

    async def call(self, what: str, deadline: Any, write: Any, **kw: Any) -> None:
        return None


def leases() -> HolderLeases:
    return HolderLeases(NO_API, "reclaimd", "me", lease_s=10.0, limiter=cast(Any, Accepting()))


async def test_a_renewal_after_a_gap_past_the_lease_marks_a_lapse() -> None:
    h = leases()
    assert not h.fresh()
    await h.renew()
    claimed = utcnow()
    assert h.fresh() and h.unbroken_since(claimed - timedelta(seconds=1))
    # An API server down for longer than the Lease: our last renewal is 30 s old.
    assert h.renewed_at is not None
    h.renewed_at -= timedelta(seconds=30)
    assert not h.fresh()
    await h.renew()
    assert h.fresh()  # renewed again...
    assert not h.unbroken_since(claimed)  # ...but a peer may have taken that claim over
    assert h.unbroken_since(utcnow() + timedelta(seconds=1))  # a claim made after is safe


class Listing:
    """The LIST of holder Leases a replica reads, as the API server would answer it."""

    def __init__(self, leases: list[Any]) -> None:
        self.leases = leases
        self.written: list[str] = []

    async def read(self, what: str, deadline: Any, call: Any, **kw: Any) -> Any:
        if what.startswith("read lease/"):  # one holder's Lease, read afresh
            name = what.removeprefix("read lease/")
            found = [x for x in self.leases if lease_name(holder_of(x)) == name]
            if not found:
                raise errors.NotFound(name, 404)
            return found[0]
        return {"kind": "LeaseList", "items": self.leases}

    async def call(self, what: str, deadline: Any, write: Any, **kw: Any) -> None:
        self.written.append(what)  # the sweep of a Lease gone for good


def holder_of(lease: dict[str, Any]) -> str:
    return str(lease["metadata"]["annotations"][HOLDER_ANNOTATION])


def micro(t: datetime) -> str:
    """A MicroTime as the API server sends it."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def holder_lease(holder: str, renewed: datetime, probe: str, group: str = "g") -> dict[str, Any]:
    """A holder Lease as the API server lists it (JSON, camelCase)."""
    return {
        "metadata": {
            "name": f"l-{holder}",
            "resourceVersion": "1",
            "annotations": {
                HOLDER_ANNOTATION: holder,
                PROBE_ANNOTATION: probe,
                GROUP_ANNOTATION: group,
            },
        },
        "spec": {"renewTime": micro(renewed), "acquireTime": micro(utcnow())},
    }


def prober(listing: Listing, silent_after_s: float = 3.0) -> HolderLeases:
    """Our holder Leases, of group "g", probing every 50 ms the peers ``listing`` names."""
    return HolderLeases(
        NO_API,
        "reclaimd",
        "me",
        lease_s=10.0,
        limiter=cast(Any, listing),
        probe_every_s=0.05,
        probe_timeout_s=0.2,
        silent_after_s=silent_after_s,
        group="g",
    )


async def test_a_peer_that_refuses_its_probe_is_dead_until_it_renews_again() -> None:
    closed = Listener("127.0.0.1", 0)
    await closed.start()
    address = closed.address
    await closed.close()  # nothing listens there now: a SIGKILLed process
    live = Listener("127.0.0.1", 0)
    await live.start()
    now = utcnow()
    listing = Listing(
        [
            holder_lease("gone", now, address),
            holder_lease("up", now, live.address),
            holder_lease("other-deployment", now, live.address, group="h"),
        ]
    )
    h = prober(listing)
    await h.refresh()
    assert h.peer_alive()
    probing = asyncio.create_task(h.run_probes())
    try:
        async with asyncio.timeout(5):
            await h.deaths.wait()
        assert h.dead("gone") and not h.dead("up") and not h.dead("me")
        assert not await h.alive("gone")  # no read needed: known dead
        # The same holder name back (a container restart) renews: alive again.
        listing.leases[0] = holder_lease("gone", now + timedelta(seconds=2), address)
        await h.refresh()
        assert not h.dead("gone")
    finally:
        probing.cancel()
        await live.close()


async def test_a_refused_connection_is_death_and_an_answer_is_life() -> None:
    live = Listener("127.0.0.1", 0)
    await live.start()
    address = live.address
    try:
        assert await probe.probe(address, 0.5) is probe.Verdict.ALIVE
    finally:
        await live.close()
    assert live.address == ""  # a closed listener advertises nothing
    assert await probe.probe(address, 0.5) is probe.Verdict.DEAD
    assert await probe.probe("not-an-address", 0.5) is probe.Verdict.SILENT


async def test_a_wildcard_listener_is_probed_at_the_port_it_advertises() -> None:
    """A bind on every interface with port 0 must not advertise a port only one address
    family holds (a live replica probed DEAD at the other one's)."""
    for _ in range(10):
        live = Listener("", 0, "127.0.0.1")
        await live.start()
        try:
            assert await probe.probe(live.address, 0.5) is probe.Verdict.ALIVE
        finally:
            await live.close()


async def test_a_released_lease_is_a_dead_holder_at_once() -> None:
    """A successor that never saw the stopping replica alive need not wait out its Lease."""
    listing = Listing([holder_lease("stopped", FIRST, "")])
    h = HolderLeases(NO_API, "reclaimd", "me", lease_s=10.0, limiter=cast(Any, listing), group="g")
    await h.refresh()
    assert h.dead("stopped") and h.deaths.is_set() and not h.peer_alive()
    assert h._sweeping is None  # released just now: kept for successors that start later
    # Released over an hour ago: swept as gone for good, still dead.
    old = holder_lease("old", FIRST, "")
    old["spec"]["acquireTime"] = micro(utcnow() - timedelta(hours=2))
    listing.leases.append(old)
    await h.refresh()
    assert h._sweeping is not None
    await h._sweeping
    assert h.dead("old") and listing.written


async def test_a_peer_answers_what_acks_it_holds_and_a_probe_still_reads_alive() -> None:
    held = {"ab12": {"gang-x": '{"uid-1":{"at":null}}'}}
    live = Listener("127.0.0.1", 0, answer=lambda label: held.get(label, {}))
    await live.start()
    try:
        assert await probe.ask(live.address, "ab12", 1.0) == held["ab12"]
        assert await probe.ask(live.address, "cd34", 1.0) == {}
        assert await probe.ask(live.address, "../etc", 1.0) == {}  # never sent: not a label
        assert await probe.probe(live.address, 0.5) is probe.Verdict.ALIVE
    finally:
        await live.close()
    # gone, paused or never listening: nothing to learn, and no error
    assert await probe.ask(live.address, "ab12", 0.5) == {}
    assert await probe.ask("", "ab12", 0.5) == {}


async def test_a_listener_without_answers_hangs_up_on_a_question() -> None:
    live = Listener("127.0.0.1", 0)
    await live.start()
    try:
        assert await probe.ask(live.address, "ab12", 1.0) == {}
    finally:
        await live.close()


async def test_a_replica_without_a_renewal_for_cut_after_s_says_it_is_cut_off() -> None:
    """What it tells a probing peer is what its own fences obey: once it may have been taken
    over on its own word, every claim is read before it acts on it again."""
    h = leases()  # lease_s 10: cut off after 6 s without a renewal
    assert not h.cut_off()  # never renewed: no claims, nothing to say
    await h.renew()
    claimed = utcnow()
    listener = Listener("127.0.0.1", 0, cut=h.cut_off)
    await listener.start()
    try:
        assert not h.cut_off() and h.unbroken_since(claimed - timedelta(seconds=1))
        assert await probe.probe(listener.address, 0.5) is probe.Verdict.ALIVE
        assert h.renewed_at is not None
        h.renewed_at -= timedelta(seconds=h.cut_after_s + 0.5)  # within the Lease, past the cut
        assert h.cut_off() and not h.fresh()
        assert not h.unbroken_since(claimed - timedelta(seconds=1))
        assert await probe.probe(listener.address, 0.5) is probe.Verdict.CUT
        await h.renew()  # the API server reached again
        assert not h.cut_off()
        assert await probe.probe(listener.address, 0.5) is probe.Verdict.ALIVE
        assert not h.unbroken_since(claimed)  # the peer may have taken that claim over
    finally:
        await listener.close()


class Slow(Accepting):
    """Writes that land ``s`` after they are sent (a partition that holds requests)."""

    def __init__(self, s: float) -> None:
        self.s = s

    async def call(self, what: str, deadline: Any, write: Any, **kw: Any) -> None:
        await asyncio.sleep(self.s)


async def test_a_renewal_that_lands_after_the_cut_marks_a_lapse() -> None:
    """Sent inside the cut, landed past it: a peer may have acted on what we said meanwhile."""
    h = HolderLeases(NO_API, "reclaimd", "me", lease_s=1.0, limiter=cast(Any, Slow(0.0)))
    await h.renew()
    claimed = utcnow()
    assert h.renewed_at is not None
    h.renewed_at -= timedelta(seconds=h.cut_after_s - 0.2)
    h._limiter = cast(Any, Slow(0.4))
    await h.renew()
    assert not h.unbroken_since(claimed)


async def test_a_peer_that_says_it_is_cut_off_is_presumed_dead_until_it_renews() -> None:
    cut = Listener("127.0.0.1", 0, cut=lambda: True)
    fine = Listener("127.0.0.1", 0, cut=lambda: False)
    await cut.start()
    await fine.start()
    now = utcnow()
    listing = Listing(
        [holder_lease("cut", now, cut.address), holder_lease("fine", now, fine.address)]
    )
    h = prober(listing)
    await h.refresh()
    probing = asyncio.create_task(h.run_probes())
    try:
        async with asyncio.timeout(5):
            await h.deaths.wait()
        assert h.dead("cut") and not h.dead("fine")
        listing.leases[0] = holder_lease("cut", now + timedelta(seconds=2), cut.address)
        await h.refresh()
        assert not h.dead("cut")  # it reached the API server again
    finally:
        probing.cancel()
        await cut.close()
        await fine.close()


class SlowList(Listing):
    def __init__(self) -> None:
        super().__init__([])
        self.renewals = 0

    async def read(self, what: str, deadline: Any, call: Any, **kw: Any) -> Any:
        await asyncio.sleep(5.0)  # a LIST queued behind a storm's writes
        return await super().read(what, deadline, call, **kw)

    async def call(self, what: str, deadline: Any, write: Any, **kw: Any) -> None:
        self.renewals += 1


async def test_renewals_do_not_wait_for_a_slow_list_of_the_peers() -> None:
    listing = SlowList()
    h = HolderLeases(NO_API, "reclaimd", "me", lease_s=0.3, limiter=cast(Any, listing))
    running = asyncio.create_task(h.run())
    await asyncio.sleep(1.0)
    running.cancel()
    # Every 0.1 s while the first LIST is still out: never one renewal per LIST.
    assert listing.renewals >= 3 and not h.cut_off()


async def test_a_stopping_replica_asks_whether_its_peer_is_alive_now() -> None:
    """The peer died after the last probe round (SIGKILLed a moment before our SIGTERM): the
    LIST still calls it alive, one more probe does not, and nothing is handed to it."""
    gone = Listener("127.0.0.1", 0)
    await gone.start()
    address = gone.address
    await gone.close()
    live = Listener("127.0.0.1", 0)
    await live.start()
    try:
        now = utcnow()
        h = prober(Listing([holder_lease("peer", now, address)]))
        await h.refresh()
        assert h.peer_alive() and not await h.peer_alive_now()
        h = prober(Listing([holder_lease("peer", now, live.address)]))
        await h.refresh()
        assert await h.peer_alive_now()
    finally:
        await live.close()


async def test_a_probe_is_answered_while_the_loop_is_blocked() -> None:
    """A replica CPU-starved in a storm lags its loop by seconds: its probe port still
    answers (from its own thread), "slow" rather than "cut", so no peer takes it over."""
    live = Listener("127.0.0.1", 0, cut=lambda: True)  # its renewals late: would say cut
    await live.start()
    address = live.address

    def probe_from_elsewhere() -> probe.Verdict:
        time.sleep(probe.LAG_S + 0.3)  # once the loop is seen lagging
        return asyncio.run(probe.probe(address, 0.5))

    try:
        asked = asyncio.get_running_loop().run_in_executor(None, probe_from_elsewhere)
        time.sleep(probe.LAG_S + 1.0)  # noqa: ASYNC251 -- the loop blocked, as a storm's CPU does
        assert await asked is probe.Verdict.ALIVE
        assert live.lagging() is False  # the heartbeat runs again once the loop does
    finally:
        await live.close()


STOPPABLE = """
import asyncio, sys
from reclaimd.cluster.probe import Listener
async def main():
    live = Listener("127.0.0.1", 0)
    await live.start()
    print(live.address, flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""


async def test_a_stopped_process_is_silent_and_answers_again_when_continued() -> None:
    """SIGSTOP: the kernel still accepts the connection, nobody answers: silent, not dead."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", STOPPABLE, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        address = (await proc.stdout.readline()).decode().strip()
        assert await probe.probe(address, 0.5) is probe.Verdict.ALIVE
        proc.send_signal(signal.SIGSTOP)
        assert await probe.probe(address, 0.5) is probe.Verdict.SILENT
        proc.send_signal(signal.SIGCONT)
        assert await probe.probe(address, 2.0) is probe.Verdict.ALIVE
    finally:
        proc.kill()
        await proc.wait()


async def test_a_silent_peer_is_dead_only_once_its_lease_goes_unrenewed_as_long() -> None:
    """Unanswered probes and an unrenewed Lease: a stopped replica, taken over in seconds. A
    peer out of our reach that still renews is alive; its claims stay its own."""
    mute = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog), answers nothing
    address = f"127.0.0.1:{mute.getsockname()[1]}"
    now = utcnow()
    listing = Listing(
        [
            holder_lease("stopped", now - timedelta(seconds=1.0), address),
            holder_lease("renewing", now, address),
        ]
    )
    h = prober(listing, silent_after_s=0.6)

    async def renew() -> None:
        while True:
            listing.leases[1] = holder_lease("renewing", utcnow(), address)
            await asyncio.sleep(0.1)

    renewing = asyncio.create_task(renew())
    await h.refresh()
    probing = asyncio.create_task(h.run_probes())
    started = time.monotonic()
    try:
        async with asyncio.timeout(5):
            await h.deaths.wait()
        assert time.monotonic() - started >= 0.6  # never before the silence is long enough
        assert h.dead("stopped") and not h.dead("renewing")
        await asyncio.sleep(1.5)  # out of our reach all along, but renewing: not dead
        assert not h.dead("renewing")
        renewing.cancel()  # it stops renewing too: a whole node gone
        h.deaths.clear()
        async with asyncio.timeout(5):
            await h.deaths.wait()
        assert h.dead("renewing")
    finally:
        renewing.cancel()
        probing.cancel()
        mute.close()


def test_silence_must_be_shorter_than_the_claim_lease_and_outlast_two_renewals() -> None:
    from reclaimd.config import Settings
    from reclaimd.settings.peers import PeerProbeSettings

    with pytest.raises(ValidationError, match="renew_every_s must be at most half"):
        PeerProbeSettings(renew_every_s=2.0, silent_after_s=3.0)
    with pytest.raises(ValidationError, match="silent_after_s must be shorter than claim_stale_s"):
        Settings(claim_stale_s=5.0, peer_probe={"silent_after_s": 6.0})
    s = Settings()
    h = HolderLeases(
        NO_API,
        "reclaimd",
        "me",
        lease_s=s.claim_stale_s,
        limiter=cast(Any, Accepting()),
        silent_after_s=s.peer_probe.silent_after_s,
    )
    # We fence ourselves no later than a peer may take us over.
    assert h.cut_after_s <= h.silent_after_s


async def test_a_peer_presumed_dead_is_back_once_it_answers_and_renewed_since() -> None:
    """Cut off, then healed: the peer learns it at its next probe, not its next LIST (until
    then claims the healed replica wrote would be taken over). A renewal from before its death,
    in a LIST newer than the last one, brings nothing back; a released Lease neither."""
    cut = [True]
    peer = Listener("127.0.0.1", 0, cut=lambda: cut[0])
    await peer.start()
    before = utcnow() - timedelta(seconds=0.5)  # its last renewal before the cut
    listing = Listing([holder_lease("peer", before - timedelta(seconds=3), peer.address)])
    h = prober(listing)
    await h.refresh()

    async def probe_round() -> None:  # one round of ``run_probes``
        await h._probe({"peer": peer.address})

    try:
        await probe_round()
        assert h.dead("peer") and h.deaths.is_set()
        listing.leases[0] = holder_lease("peer", before, peer.address)  # the LIST is newer
        await h.refresh()
        assert h.dead("peer")  # renewed before we presumed it dead: still dead
        cut[0] = False  # it reaches the API server and answers so, but has not renewed yet
        await probe_round()
        assert h.dead("peer")
        listing.leases[0] = holder_lease("peer", utcnow(), peer.address)  # renewed
        await probe_round()
        assert not h.dead("peer")
        # Released (a stopping replica answers until its port closes): dead, and stays so.
        listing.leases[0] = holder_lease("peer", FIRST, peer.address)
        await h.refresh()
        assert h.dead("peer")
        await probe_round()
        assert h.dead("peer")
    finally:
        await peer.close()
