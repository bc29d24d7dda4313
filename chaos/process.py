"""Run reclaimd as a real process (``reclaimd run``), the way an operator would."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml


class DaemonProcess:
    """``reclaimd run --config FILE`` in a subprocess; ``start`` returns once it is running."""

    def __init__(
        self,
        config: dict[str, Any],
        workdir: Path,
        name: str = "reclaimd",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.name = name
        self.env = dict(env or {})  # on top of this process's environment (OTEL_*, ...)
        self.config_path = workdir / f"{name}.yaml"
        self.log_path = workdir / f"{name}.log"
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.proc: asyncio.subprocess.Process | None = None
        self.paused = False

    async def start(self, timeout_s: float = 60) -> None:
        """Start (or start again, after a crash: the log goes on, the config is the same)."""
        seen = len(self._log_bytes())  # a restart's log already says "running" from before
        log = self.log_path.open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "reclaimd.cli",
            "run",
            "--config",
            str(self.config_path),
            stdout=log,
            stderr=log,
            env={**os.environ, **self.env},
        )
        log.close()
        end = asyncio.get_running_loop().time() + timeout_s
        while b'"reclaimd running"' not in self._log_bytes()[seen:]:
            if self.proc.returncode is not None:
                raise RuntimeError(f"reclaimd exited {self.proc.returncode}: {self.tail()}")
            if asyncio.get_running_loop().time() > end:
                # Not left behind: an orphan would watch the cluster through every later run.
                self.proc.kill()
                await self.proc.wait()
                raise TimeoutError(f"reclaimd not running after {timeout_s}s: {self.tail()}")
            await asyncio.sleep(0.1)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def _log_bytes(self) -> bytes:
        try:
            return self.log_path.read_bytes()
        except FileNotFoundError:
            return b""

    def stats(self) -> dict[str, Any]:
        """What the process said of itself as it stopped (writes by kind, peak RSS)."""
        for line in reversed(self._log_bytes().splitlines()):
            if b'"reclaimd stopped"' in line:
                try:
                    doc = json.loads(line)
                except ValueError:
                    return {}
                keep = ("kube_writes", "kube_budget", "peak_rss_mb", "modules_loaded")
                return {k: doc[k] for k in keep if k in doc}
        return {}

    def tail(self, lines: int = 5) -> str:
        return " | ".join(self._log_bytes().decode(errors="replace").splitlines()[-lines:])

    async def stop(self, timeout_s: float = 15) -> int | None:
        if self.proc is None or self.proc.returncode is not None:
            return None if self.proc is None else self.proc.returncode
        if self.paused:
            self.resume()  # a stopped process would not see the SIGTERM
        self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            self.proc.kill()
            return await self.proc.wait()

    def terminate(self) -> None:
        """SIGTERM and return at once (a ``term`` fault times the exit itself)."""
        if self.paused:
            self.resume()
        self._signal(signal.SIGTERM)

    async def wait(self) -> int | None:
        """Until the process is gone; its exit status (negative: the signal that ended it)."""
        return None if self.proc is None else await self.proc.wait()

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: a crash, for the resume tests."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def crash(self) -> None:
        """SIGKILL and wait until it is gone (a fault drill's kill)."""
        self.kill()
        if self.proc is not None:
            await self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP: a hung process (it renews nothing, its sockets stay open)."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        self._signal(signal.SIGCONT)
        self.paused = False

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
