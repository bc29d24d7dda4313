"""Issue 37: a replica that goes silent (SIGSTOP, or cut from the apiserver) holding claims whose
ranks it had not asked yet. Whoever finishes those notices must still leave the ranks most of
the notice's window to save in: a takeover only after the claim lease (20 s of a 30 s GCE
window) leaves them a few seconds. ``ask_budget_check`` measures, for each gang of each notice
the silent replica held, the time from the ask reaching its last rank to the notice's
deadline, against ``min_ask_budget`` of the window (deadline - sent)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from chaos.drill.verdict.facts import FaultFacts, GangFacts, NoticeFacts, unique_notices
from chaos.drill.verdict.model import Check

SILENCES = frozenset({"pause", "partition"})  # the holder lives on but says nothing


def _last_asked(g: GangFacts) -> tuple[datetime | None, int]:
    """When the last opted-in rank got its first request (any notice's: a rank already saving
    for another notice is saving), and how many ranks were never asked (then None)."""
    firsts = [
        min((s.received_at for s in r.saves.values()), default=None)
        for r in g.ranks
        if r.opted_in
    ]
    missing = sum(1 for t in firsts if t is None)
    asked = [t for t in firsts if t is not None]
    return (max(asked) if asked and not missing else None), missing


def ask_budget_check(
    faults: Sequence[FaultFacts],
    notices: Sequence[NoticeFacts],
    gangs: Mapping[str, GangFacts],
    fraction: float,
) -> Check:
    """Each gang of each notice a silenced replica held at its silence: its last rank asked
    at least ``fraction`` of the notice's window before the deadline, and after the silence
    began (asked before it, the drill did not test a silent holder's gang)."""
    by_id = {n.notice_id: n for n in unique_notices(notices)}
    rows: list[str] = []
    bad: list[str] = []
    for f in faults:
        if f.kind not in SILENCES:
            continue
        for notice_id in sorted(set(f.held.values())):
            n = by_id.get(notice_id)
            if n is None or n.deadline is None:
                continue  # not one of the drill's notices, or no deadline to measure from
            window = (n.deadline - n.sent_at).total_seconds()
            for name in n.gangs:
                g = gangs.get(name)
                if g is None or not any(r.opted_in for r in g.ranks):
                    continue  # nothing to ask
                last, missing = _last_asked(g)
                if last is None:
                    bad.append(f"{name}: {missing} rank(s) never asked")
                    continue
                left = (n.deadline - last).total_seconds()
                row = f"{name}: asked {left:.1f}s before its deadline ({window:.0f}s window)"
                rows.append(row)
                if last < f.started_at:
                    bad.append(f"{name}: asked before {f.label} (not a silent holder's gang)")
                elif left < fraction * window:
                    bad.append(f"{row}, under {fraction * window:.1f}s")
    if not rows and not bad:
        bad.append("no silenced replica held a claim with a gang to ask")
    return Check(
        f"a silent holder's gangs asked with {fraction:.0%} of their window left",
        not bad,
        "; ".join(bad) if bad else "; ".join(rows),
    )
