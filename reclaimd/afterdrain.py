"""What a source must do around a notice's drain (the runbook calls it, the source owns it).

An ASG lifecycle termination, for one, holds its instance until told: it wants heartbeats while
the drain runs and ``CompleteLifecycleAction`` once the gangs are drained. The runbook knows
no source, so it calls this protocol; ``reclaimd.handlers`` builds the enabled sources' parts.
This module imports only the model, so the pipeline may import it (its import contract).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from reclaimd.model import Notice


class AfterDrain(Protocol):
    """Around and after a notice's drain. Neither call raises into the runbook."""

    def holding(self, notice: Notice) -> AbstractAsyncContextManager[None]:
        """Entered before the drain starts, left when it ends (however it ends)."""
        ...

    async def finished(self, notice: Notice, drained: bool) -> None:
        """The notice's gangs are drained (``drained``) or the runbook gave up on them.
        Idempotent: a notice resumed after a crash calls it again."""
        ...


class NoAfterDrain:
    """Nothing to do: no enabled source owns an after-drain step."""

    @contextlib.asynccontextmanager
    async def holding(self, notice: Notice) -> AsyncIterator[None]:
        yield

    async def finished(self, notice: Notice, drained: bool) -> None:
        return None


class AfterDrains:
    """Several sources' parts as one: each holds, each is told when the drain finished."""

    def __init__(self, parts: Sequence[AfterDrain]) -> None:
        self.parts = tuple(parts)

    @contextlib.asynccontextmanager
    async def holding(self, notice: Notice) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for part in self.parts:
                await stack.enter_async_context(part.holding(notice))
            yield

    async def finished(self, notice: Notice, drained: bool) -> None:
        for part in self.parts:
            await part.finished(notice, drained)
