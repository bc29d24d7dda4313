"""Striking a drill's world with the scenario's faults (``chaos.drill.faults``) as the notices go
out: what a fault needs of the drill (the replicas, the claims, putting back what a restarted
emulator lost), and the record of each fault for the judge (``FaultDriver.faults``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from chaos.drill import faults
from chaos.drill.common import retrying, yaml_holder
from chaos.drill.plan import Plan
from chaos.drill.scenario import Fault, FaultKind, Source
from chaos.drill.watch import claim_docs

if TYPE_CHECKING:
    from chaos.drill.faults import FaultRecord
    from chaos.drill.injector import Injector
    from chaos.drill.local import World
    from chaos.harness import Harness
    from chaos.process import DaemonProcess
    from chaos.stack import StackEnv

ON_CLAIM_POLL_S = 0.1  # an on_claim fault reads the claims this often
ON_CLAIM_WAIT_S = 30.0  # and strikes replica 0 if none is held by then


class FaultDriver:
    """Applies each fault when the injector's clock says so, one outage of the shared stack at
    a time; owns the records of the faults applied (``faults``)."""

    def __init__(
        self,
        plan: Plan,
        stack: StackEnv,
        world: World,
        injector: Injector,
        *,
        say: Callable[[str], None],
    ) -> None:
        self.plan = plan
        self.stack = stack
        self.world = world
        self.injector = injector
        self.say = say
        self.faults: list[FaultRecord] = []
        self._stack_faults = asyncio.Lock()  # one outage of the shared stack at a time

    async def apply(self, h: Harness, f: Fault) -> None:
        """Apply ``f`` now (an ``on_claim`` fault: once a replica holds a claim); returns once
        its outage is over (its record kept)."""
        if f.on_claim:
            f = await self._claim_holder(h, f)
        if f.replica is None:
            async with self._stack_faults:
                self.faults.append(await faults.apply(f, self.stack, self._hooks(h)))
        else:
            self.faults.append(await faults.apply(f, self.stack, self._hooks(h)))

    async def _claim_holder(self, h: Harness, f: Fault) -> Fault:
        """``f`` aimed at the first replica seen holding an open claim. Polled faster than the
        watcher's claims: the runbook may act on a claim soon after it is written."""
        hooks = self._hooks(h)
        index = {hooks.holder_of(d): i for i, d in enumerate(self.world.replicas)}
        loop = asyncio.get_running_loop()
        end = loop.time() + ON_CLAIM_WAIT_S
        while loop.time() < end:
            with contextlib.suppress(Exception):  # a read that fails is tried again
                for holder, _ in sorted((await hooks.open_claims()).values()):
                    if holder in index:
                        self.say(f"fault {f.label}: {holder} holds a claim")
                        return f.model_copy(update={"replica": index[holder]})
            await asyncio.sleep(ON_CLAIM_POLL_S)
        # Nobody claimed: strike replica 0 anyway, the verdict shows no claim was held.
        self.say(f"fault {f.label}: no claim seen in {ON_CLAIM_WAIT_S:g}s, striking reclaimd-0")
        return f.model_copy(update={"replica": 0})

    def _hooks(self, h: Harness) -> faults.FaultHooks:
        async def replace(i: int) -> DaemonProcess:
            return await self.world.replace_replica(h, i)

        async def open_claims() -> dict[str, tuple[str, str]]:
            out = {}
            for key, raw in (await claim_docs(h, self.plan)).items():
                if raw.get("phase") not in (None, "", "done"):
                    out[key] = (str(raw.get("holder", "")), str(raw.get("notice_id", "")))
            return out

        return faults.FaultHooks(
            replica=lambda i: self.world.replicas[i],
            holder_of=lambda d: str(yaml_holder(d)),
            replace=replace,
            open_claims=open_claims,
            after_restart=lambda kind: self._after_restart(h, kind),
            say=self.say,
            readyz=self._readyz if self.world.ports else None,
            partition=self.world.partition if self.world.proxies else None,
        )

    async def _readyz(self) -> dict[str, int]:
        """``/readyz`` of every central replica that runs (not paused): name -> HTTP status,
        0 for no answer within a second."""
        import aiohttp

        ports = self.world.ports
        live = [
            d for d in self.world.replicas
            if d.name in ports and d.running and not d.paused
        ]  # fmt: skip
        timeout = aiohttp.ClientTimeout(total=1.0)

        async def one(session: aiohttp.ClientSession, name: str) -> int:
            try:
                async with session.get(f"http://127.0.0.1:{ports[name]}/readyz") as r:
                    return r.status
            except (aiohttp.ClientError, TimeoutError):
                return 0

        async with aiohttp.ClientSession(timeout=timeout) as session:
            answers = await asyncio.gather(*(one(session, d.name) for d in live))
        return {d.name: status for d, status in zip(live, answers, strict=True)}

    async def _after_restart(self, h: Harness, kind: FaultKind) -> int:
        """Put back what a restarted in-memory emulator lost and a real service would have
        kept: the run's queue (or topic and subscription), every notice sent before that no
        claim records yet (its message would still be in a real queue), and every notice whose
        send was under way when the emulator went down (a publish into a dying emulator can
        hang for its whole 30 s timeout: a real topic would have taken it)."""
        if kind is FaultKind.RESTART_MOTO:
            await retrying(lambda: asyncio.to_thread(h.create_queue))
            source = Source.EC2_SQS
        else:
            await retrying(self.world.pubsub_recreate)
            source = Source.GKE_PUBSUB
        claims = await retrying(lambda: claim_docs(h, self.plan))
        unclaimed = [
            n for n in self.injector.sent
            if n.source == source.value and claims.get(n.claim_key, {}).get("notice_id")
            != n.notice_id
        ]  # fmt: skip
        resend = self.injector.resend
        under_way = [
            label for label, s in self.injector.under_way.items() if s is source and label in resend
        ]
        for label in [n.label for n in unclaimed] + under_way:
            await retrying(resend[label])
        return len(unclaimed) + len(under_way)
