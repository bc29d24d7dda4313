"""aws-node-termination-handler for ``make bench-peers``: built (deploy/local/nth/build.sh), its
identity and environment, run as a process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from chaos.bench.peers.common import NTH_BUILD, NTH_VERSION, REGION, BenchError

# --- NTH: build, identity, process ------------------------------------------------------------


def ensure_nth() -> Path:
    """The cached NTH binary; build.sh builds it first if missing (its progress on stderr)."""
    try:
        done = subprocess.run(
            ["bash", str(NTH_BUILD), NTH_VERSION], stdout=subprocess.PIPE, text=True, check=False
        )
    except OSError as e:
        raise BenchError(f"cannot run {NTH_BUILD}: {e.strerror}") from e
    if done.returncode != 0:
        raise BenchError(f"building NTH {NTH_VERSION} failed (exit {done.returncode}); see above")
    path = Path(done.stdout.strip().splitlines()[-1])
    if not os.access(path, os.X_OK):
        raise BenchError(f"build.sh printed {path}, which is not an executable")
    return path


# Runs as `sh -c SCRIPT sh TOKEN CA NAMESPACE BINARY` inside `unshare --mount`: a private
# tmpfs over /run (/var/run -> /run) holds the service-account files where
# rest.InClusterConfig() looks, then NTH replaces the shell, so the PID we hold is NTH's.
NTH_MOUNT_SCRIPT = """set -e
mount -t tmpfs -o size=1m,mode=755 tmpfs /run
d=/run/secrets/kubernetes.io/serviceaccount
mkdir -p "$d"
touch "$d/token" "$d/ca.crt" "$d/namespace"
mount --bind "$1" "$d/token"
mount --bind "$2" "$d/ca.crt"
mount --bind "$3" "$d/namespace"
exec "$4"
"""


def nth_env(
    *, queue_url: str, aws_endpoint: str, api_host: str, api_port: str, workers: int
) -> dict[str, str]:
    """Queue mode at its best (nth-peer-bench.md, "A fair comparison"), as far as it works."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "KUBERNETES_SERVICE_HOST": api_host,
        "KUBERNETES_SERVICE_PORT": api_port,
        "NODE_NAME": "bench-peers-nth",  # required even in queue mode
        "ENABLE_SQS_TERMINATION_DRAINING": "true",
        "QUEUE_URL": queue_url,
        "AWS_REGION": REGION,
        "AWS_ENDPOINT": aws_endpoint,  # aws-sdk-go v1: SQS and EC2 (AWS_ENDPOINT_URL ignored)
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "WORKERS": str(workers),
        "TAINT_NODE": "true",
        # Not "true": in v1.25.6 that path lists a node's pods only inside the Kubernetes-events
        # branch (pkg/node/node.go, CordonAndDrain), so with events off it cordons and evicts
        # nothing, and still deletes the message. "false" drains (one quorum-read LIST per node).
        "USE_APISERVER_CACHE": "false",
        "CHECK_TAG_BEFORE_DRAINING": "false",
        "CHECK_ASG_TAG_BEFORE_DRAINING": "false",
        "EMIT_KUBERNETES_EVENTS": "false",
        "SQS_MSG_VISIBILITY_TIMEOUT_SEC": "119",
        "POD_TERMINATION_GRACE_PERIOD": "-1",  # the pod's own, as reclaimd's evictions
        "ENABLE_PROMETHEUS_SERVER": "false",
        "ENABLE_PROBES_SERVER": "false",
        "JSON_LOGGING": "true",
        "LOG_LEVEL": "info",
    }


@dataclass
class NthProcess:
    binary: Path
    workdir: Path
    env: dict[str, str]
    token: Path
    ca: Path
    namespace_file: Path
    name: str = "nth"
    proc: asyncio.subprocess.Process | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def _log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 3) -> str:
        return " | ".join(self._log().splitlines()[-lines:])

    async def start(self, timeout_s: float = 60) -> None:
        log = self.log_path.open("ab")
        args = [str(self.token), str(self.ca), str(self.namespace_file), str(self.binary)]
        self.proc = await asyncio.create_subprocess_exec(
            "unshare", "--mount", "--propagation", "private",
            "sh", "-c", NTH_MOUNT_SCRIPT, "sh", *args,
            stdout=log, stderr=log, env=self.env,
        )  # fmt: skip
        log.close()
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while "Started watching for interruption events" not in self._log():
            if self.proc.returncode is not None:
                raise BenchError(f"NTH exited {self.proc.returncode}: {self.tail()}")
            if loop.time() > end:
                raise BenchError(f"NTH not running after {timeout_s:g}s: {self.tail()}")
            await asyncio.sleep(0.1)

    async def stop(self, timeout_s: float = 10) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
