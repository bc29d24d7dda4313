"""Where the local stack runs: read ``.stack/stack.env`` written by ``deploy/local/stack.sh``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class StackNotRunning(RuntimeError):
    pass


@dataclass(frozen=True)
class KafkaListener:
    """One of the stack's Kafka listeners as reclaimd sees it: a ``bootstrap`` and the
    settings' ``kafka:`` section (empty: PLAINTEXT)."""

    name: str
    bootstrap: str
    settings: dict[str, Any]


@dataclass(frozen=True)
class StackEnv:
    dir: Path
    values: dict[str, str]

    def __getitem__(self, key: str) -> str:
        return self.values[key]

    @property
    def kubeconfig(self) -> str:
        return self.values["KUBECONFIG"]

    @property
    def reclaimd_kubeconfig(self) -> str:
        return self.values["RECLAIMD_KUBECONFIG"]

    @property
    def kafka(self) -> str:
        return self.values["KAFKA_BOOTSTRAP"]

    def kafka_as_reclaimd(self, listener: str = "") -> KafkaListener:
        """How a reclaimd replica reaches the stack's Kafka on ``listener``: ``sasl_ssl``
        (SCRAM-SHA-512 user reclaimd over TLS, the rig's default: production's shape),
        ``ssl`` (a client certificate) or ``plaintext``; empty: ``$RECLAIMD_RIG_KAFKA`` or
        ``sasl_ssl``. As User:reclaimd the replica has only its ACLs; the rig's own clients
        use ``kafka`` (PLAINTEXT, a super user)."""
        name = (listener or os.environ.get("RECLAIMD_RIG_KAFKA") or "sasl_ssl").lower()
        pki = Path(self.values["KAFKA_PKI_DIR"]) if "KAFKA_PKI_DIR" in self.values else None
        if name == "plaintext" or pki is None:
            return KafkaListener("plaintext", self.kafka, {})
        ca = str(pki / "ca.crt")
        if name == "sasl_ssl":
            return KafkaListener(
                name,
                self.values["KAFKA_SASL_SSL_BOOTSTRAP"],
                {
                    "security_protocol": "SASL_SSL",
                    "tls": {"ca_file": ca},
                    "sasl": {
                        "mechanism": "SCRAM-SHA-512",
                        "username": "reclaimd",
                        "password_file": str(pki / "reclaimd.password"),
                    },
                },
            )
        if name == "ssl":
            return KafkaListener(
                name,
                self.values["KAFKA_SSL_BOOTSTRAP"],
                {
                    "security_protocol": "SSL",
                    "tls": {
                        "ca_file": ca,
                        "cert_file": str(pki / "client.crt"),
                        "key_file": str(pki / "client.key"),
                    },
                },
            )
        raise ValueError(f"kafka listener {name!r}: one of sasl_ssl, ssl, plaintext")

    @property
    def aws_endpoint(self) -> str:
        return self.values["AWS_ENDPOINT_URL"]

    def export(self) -> None:
        """Put the client variables (AWS credentials, emulator hosts) into this process."""
        for key, value in self.values.items():
            if key.startswith(("AWS_", "PUBSUB_")):
                os.environ[key] = value


def find_stack_dir(start: Path | None = None) -> Path:
    if os.environ.get("RECLAIMD_STACK_DIR"):
        return Path(os.environ["RECLAIMD_STACK_DIR"])
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / ".stack" / "stack.env").exists():
            return d / ".stack"
    raise StackNotRunning("no .stack/stack.env found: run `make stack-up` first")


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines, blank lines and ``#`` comments skipped, nothing expanded.

    ``StackNotRunning`` when the file cannot be read, ``ValueError`` (one line) for a line
    that is not ``KEY=VALUE``.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise StackNotRunning(f"cannot read {path}: {e.strerror}") from e
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"{path}:{number}: not a KEY=VALUE line: {line[:60]!r}")
        values[key] = value
    return values


def load(stack_dir: Path | None = None) -> StackEnv:
    d = stack_dir or find_stack_dir()
    return StackEnv(d, read_env_file(d / "stack.env"))
