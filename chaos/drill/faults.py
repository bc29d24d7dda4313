"""A drill's faults (``faults:`` in a scenario): kill, pause or replace a reclaimd replica, or
take a part of the local stack down for a moment, and record when, to what, and what it held.

Replica faults act on the drill's own ``reclaimd run`` processes:

- ``kill``: SIGKILL; with ``restart_after_s`` the same replica starts again on the same disk
  (a container restart in the same pod: same holder, same outbox, same span file);
- ``pause``: SIGSTOP for ``for_s``, then SIGCONT (a hung process keeps its claims until their
  leases run out);
- ``fresh_disk``: SIGKILL, then a replacement with an empty state dir after ``restart_after_s``
  (a new pod on a new node: a new holder name, no outbox, a new span file). The old span file
  stays readable to the judge, as spans already exported to a collector would be;
- ``term``: SIGTERM, a graceful stop, with ``grace_s`` (the manifest's 60 s) to exit before a
  SIGKILL, as the kubelet gives; with ``restart_after_s`` a successor on a fresh disk (a new
  holder) starts that long after the SIGTERM, while the old one may still be stopping: a
  rolling upgrade. When it exited and with what status is recorded: a replica that needed the
  SIGKILL, or exited non-zero, is a finding of the verdict;
- ``partition``: the replica's apiserver connections (through its own ``chaos.netproxy``)
  stop for ``for_s``, then flow again; it still reaches Kafka, SQS and the trainers.

Stack faults go through ``deploy/local/stack.sh stop|start|restart COMPONENT``, which waits
until the component answers its readiness check again:

- ``stop_kafka``: the broker down for ``for_s``;
- ``restart_apiserver``: kube-apiserver only, etcd keeps its data;
- ``restart_moto`` / ``restart_pubsub``: both keep everything in memory, so a restart loses
  every queue, topic and subscription, which a real outage of SQS or Pub/Sub never does. The
  drill puts back what a real outage would have kept: the run's queue (or topic and
  subscription) under the same name, and every notice sent before the restart that reclaimd
  had not yet claimed, sent again (a redelivery: same identity). A notice reclaimd had
  claimed has its durable record in the cluster, and its transport ack may have gone out.

During a stack fault the drill also samples the surviving replicas' ``/readyz`` every
``READY_POLL_S``, from just before the outage until every replica answers 200 again (at most
``READY_AFTER_S`` after it): whether a replica said "not ready" while the part it depends on was
down, and how soon it said "ready" after.

Every fault is timed on the drill's clock; ``FaultRecord`` is what the verdict
(``chaos.drill.verdict``) turns into "what it cost".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from chaos.drill.scenario import Fault, FaultKind
from reclaimd.model import utcnow

if TYPE_CHECKING:
    from chaos.process import DaemonProcess
    from chaos.stack import StackEnv

READY_POLL_S = 0.5
READY_AFTER_S = 30.0  # sampling /readyz stops this long after the outage at the latest
STACK_TIMEOUT_S = 240.0  # stack.sh's own limits: 180 s for the slowest component, plus stop
COMPONENT = {
    FaultKind.STOP_KAFKA: "kafka",
    FaultKind.RESTART_APISERVER: "kube-apiserver",
    FaultKind.RESTART_MOTO: "moto",
    FaultKind.RESTART_PUBSUB: "pubsub-emulator",
}


class FaultError(RuntimeError):
    """A fault could not be applied (or its component did not come back); one line."""


@dataclass
class FaultRecord:
    """One fault as it happened."""

    fault: Fault
    started_at: datetime
    ended_at: datetime | None = None  # the outage over: process back or continued, component up
    holder: str = ""  # the faulted replica's holder name (replica faults)
    successor: str = ""  # the holder that came back (same after a restart, new on a fresh disk)
    held: dict[str, str] = field(default_factory=dict)  # claim key -> notice id, open, its own
    resent: int = 0  # notices sent again after a restart_moto / restart_pubsub
    error: str = ""
    # kill, fresh_disk, term: when the process was gone and its exit status (negative: the
    # signal); term: it was still running after its grace and had to be SIGKILLed
    exited_at: datetime | None = None
    exit_code: int | None = None
    grace_s: float | None = None
    sigkilled: bool = False
    connections_cut: int = 0  # partition: the replica's apiserver connections open at the cut
    readiness: list[tuple[datetime, str, int]] = field(default_factory=list)  # when, who, HTTP

    @property
    def label(self) -> str:
        return self.fault.label

    @property
    def outage_s(self) -> float | None:
        if self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()


def stack_script(stack: StackEnv) -> Path:
    """``deploy/local/stack.sh`` of the checkout whose ``.stack`` this is."""
    return stack.dir.parent / "deploy" / "local" / "stack.sh"


async def stack_control(stack: StackEnv, action: str, component: str) -> None:
    """``stack.sh ACTION COMPONENT`` (stop, start, restart); ``FaultError`` if it fails."""
    proc = await asyncio.create_subprocess_exec(
        "bash",
        str(stack_script(stack)),
        action,
        component,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), STACK_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise FaultError(
            f"stack.sh {action} {component}: no answer in {STACK_TIMEOUT_S:g}s"
        ) from None
    if proc.returncode != 0:
        last = out.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise FaultError(f"stack.sh {action} {component} exited {proc.returncode}: {last[0]}")


@dataclass
class FaultHooks:
    """What a fault needs of the drill (kept small, so this module knows no drill internals)."""

    replica: Callable[[int], DaemonProcess]  # the current process of central replica i
    holder_of: Callable[[DaemonProcess], str]
    replace: Callable[[int], Awaitable[DaemonProcess]]  # start replica i on a fresh disk
    open_claims: Callable[[], Awaitable[Mapping[str, tuple[str, str]]]]  # key -> holder, notice
    after_restart: Callable[[FaultKind], Awaitable[int]]  # put back what moto/pubsub lost
    say: Callable[[str], None]
    # the live replicas' /readyz status by name (0: no answer); {} when none serves it
    readyz: Callable[[], Awaitable[Mapping[str, int]]] | None = None
    # cut (True) or heal (False) replica i's apiserver proxy; the connections open at a cut
    partition: Callable[[int, bool], Awaitable[int]] | None = None


async def apply(fault: Fault, stack: StackEnv, hooks: FaultHooks) -> FaultRecord:
    """Apply ``fault`` now and return once its outage is over."""
    if fault.replica is not None:
        return await _replica_fault(fault, hooks)
    return await _stack_fault(fault, stack, hooks)


async def _held_by(hooks: FaultHooks, holder: str) -> dict[str, str]:
    with contextlib.suppress(Exception):  # the apiserver may be the thing that is down
        claims = await hooks.open_claims()
        return {key: notice for key, (h, notice) in claims.items() if h == holder}
    return {}


async def _replica_fault(fault: Fault, hooks: FaultHooks) -> FaultRecord:
    assert fault.replica is not None
    d = hooks.replica(fault.replica)
    holder = hooks.holder_of(d)
    held = await _held_by(hooks, holder)
    rec = FaultRecord(fault, started_at=utcnow(), holder=holder, held=held)
    kind = fault.kind
    try:
        if kind is FaultKind.TERM:
            await _term(fault, d, hooks, rec)
            return rec
        if kind is FaultKind.PARTITION:
            if hooks.partition is None:
                raise FaultError("no apiserver proxy in front of this replica")
            rec.connections_cut = await hooks.partition(fault.replica, True)
            hooks.say(
                f"fault {fault.label}: {d.name} cut off from the apiserver"
                f" ({len(held)} open claim(s), {rec.connections_cut} connection(s) held)"
            )
            try:
                await asyncio.sleep(fault.for_s or 0.0)
            finally:
                await hooks.partition(fault.replica, False)
            rec.ended_at, rec.successor = utcnow(), holder
            hooks.say(f"fault {fault.label}: {d.name} reaches the apiserver again")
            return rec
        if kind is FaultKind.PAUSE:
            d.pause()
            hooks.say(f"fault {fault.label}: SIGSTOP {d.name} ({len(held)} open claim(s))")
            await asyncio.sleep(fault.for_s or 0.0)
            d.resume()
            rec.ended_at, rec.successor = utcnow(), holder
            hooks.say(f"fault {fault.label}: SIGCONT {d.name}")
            return rec
        await d.crash()
        rec.exited_at, rec.exit_code = utcnow(), d.returncode
        hooks.say(f"fault {fault.label}: SIGKILL {d.name} ({len(held)} open claim(s))")
        restart = fault.restart_s
        if restart is None:
            return rec  # killed for good: the outage never ends for it
        await asyncio.sleep(restart)
        if kind is FaultKind.FRESH_DISK:
            new = await hooks.replace(fault.replica)
            rec.successor = hooks.holder_of(new)
            hooks.say(f"fault {fault.label}: {new.name} up on a fresh disk")
        else:
            await d.start()
            rec.successor = holder
            hooks.say(f"fault {fault.label}: {d.name} up again on the same disk")
        rec.ended_at = utcnow()
    except Exception as e:  # the verdict shows it; the drill goes on
        rec.error = f"{type(e).__name__}: {e}"
        hooks.say(f"fault {fault.label}: {rec.error}")
    return rec


async def _term(fault: Fault, d: DaemonProcess, hooks: FaultHooks, rec: FaultRecord) -> None:
    """SIGTERM; the successor (if any) after ``restart_after_s`` while the old one stops; the
    old one's exit within its grace, or a SIGKILL after it."""
    assert fault.replica is not None
    grace = rec.grace_s = fault.the_grace_s
    d.terminate()
    hooks.say(
        f"fault {fault.label}: SIGTERM {d.name} ({len(rec.held)} open claim(s), {grace:g}s grace)"
    )

    async def exit_() -> None:
        try:
            code = await asyncio.wait_for(d.wait(), grace)
        except TimeoutError:
            rec.sigkilled = True
            hooks.say(f"fault {fault.label}: {d.name} running {grace:g}s after SIGTERM: SIGKILL")
            await d.crash()
            code = d.returncode
        rec.exited_at, rec.exit_code = utcnow(), code
        took = (rec.exited_at - rec.started_at).total_seconds()
        hooks.say(f"fault {fault.label}: {d.name} exited {code} {took:.1f}s after SIGTERM")

    async def successor() -> None:
        restart = fault.restart_s
        if restart is None:
            return  # stopped for good: nobody takes its place
        await asyncio.sleep(restart)
        assert fault.replica is not None
        new = await hooks.replace(fault.replica)
        rec.successor = hooks.holder_of(new)
        rec.ended_at = utcnow()
        hooks.say(f"fault {fault.label}: successor {new.name} up on a fresh disk")

    results = await asyncio.gather(exit_(), successor(), return_exceptions=True)
    errors = [f"{type(e).__name__}: {e}" for e in results if isinstance(e, BaseException)]
    if errors:
        rec.error = "; ".join(errors)
        hooks.say(f"fault {fault.label}: {rec.error}")


async def _sample_readiness(rec: FaultRecord, hooks: FaultHooks) -> None:
    """``/readyz`` of every live replica, every ``READY_POLL_S``, until the outage is over and
    each says 200 (or ``READY_AFTER_S`` after the outage)."""
    assert hooks.readyz is not None
    while True:
        with contextlib.suppress(Exception):
            now, answers = utcnow(), await hooks.readyz()
            rec.readiness.extend((now, name, status) for name, status in sorted(answers.items()))
            if rec.ended_at is not None and (
                all(status == 200 for status in answers.values())
                or (now - rec.ended_at).total_seconds() > READY_AFTER_S
            ):
                return
        await asyncio.sleep(READY_POLL_S)


async def _stack_fault(fault: Fault, stack: StackEnv, hooks: FaultHooks) -> FaultRecord:
    component = COMPONENT[fault.kind]
    rec = FaultRecord(fault, started_at=utcnow())
    sampler = (
        asyncio.create_task(_sample_readiness(rec, hooks)) if hooks.readyz is not None else None
    )
    try:
        await _stack_outage(fault, stack, hooks, rec, component)
    finally:
        if sampler is not None:
            if rec.ended_at is None:  # the component never came back: nothing more to wait for
                sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
    return rec


async def _stack_outage(
    fault: Fault, stack: StackEnv, hooks: FaultHooks, rec: FaultRecord, component: str
) -> None:
    try:
        if fault.kind is FaultKind.STOP_KAFKA:
            await stack_control(stack, "stop", component)
            hooks.say(f"fault {fault.label}: {component} stopped")
            await asyncio.sleep(fault.for_s or 0.0)
            await stack_control(stack, "start", component)
        else:
            await stack_control(stack, "restart", component)
        rec.ended_at = utcnow()
        hooks.say(f"fault {fault.label}: {component} up after {rec.outage_s:.1f}s")
        if fault.kind in (FaultKind.RESTART_MOTO, FaultKind.RESTART_PUBSUB):
            rec.resent = await hooks.after_restart(fault.kind)
            hooks.say(f"fault {fault.label}: transport recreated, {rec.resent} notice(s) resent")
    except Exception as e:  # the verdict shows it; the drill goes on
        rec.error = f"{type(e).__name__}: {e}"
        hooks.say(f"fault {fault.label}: {rec.error}")


async def ensure_stack_up(stack: StackEnv) -> None:
    """After a drill with stack faults: every component it touched answers again."""
    for component in COMPONENT.values():
        await stack_control(stack, "start", component)  # a no-op for one that answers
