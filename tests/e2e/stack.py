"""The local stack as tests see it: addresses and credentials from ``.stack/stack.env``.

``deploy/local/stack.sh up`` writes that file (``KEY=VALUE`` lines); this module only parses it,
so no test hard-codes a port or a path. ``RECLAIMD_STACK_DIR`` points at another stack directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from chaos import stack as chaos_stack

REPO_DIR = Path(__file__).resolve().parents[2]
DEFAULT_STACK_DIR = REPO_DIR / ".stack"

# The variables the AWS SDK and the Pub/Sub client read to find the emulators.
CLIENT_ENV_KEYS = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "PUBSUB_EMULATOR_HOST",
    "PUBSUB_PROJECT_ID",
    "KAFKA_BOOTSTRAP",
    "IMDS_URL",
    "RECLAIMD_KUBECONFIG",
)


class StackEnvError(Exception):
    """``stack.env`` is missing or malformed; the message is one line."""


@dataclass(frozen=True)
class Stack:
    kubeconfig: Path
    reclaimd_kubeconfig: Path
    kafka_bootstrap: str
    aws_endpoint: str
    pubsub_host: str
    pubsub_project: str
    imds_url: str
    stack_dir: Path


def stack_dir() -> Path:
    return Path(os.environ.get("RECLAIMD_STACK_DIR") or DEFAULT_STACK_DIR)


def read_env_file(path: Path) -> dict[str, str]:
    """The stack's own parser (``chaos.stack``), with its errors as ``StackEnvError``."""
    try:
        return chaos_stack.read_env_file(path)
    except (chaos_stack.StackNotRunning, ValueError) as e:
        raise StackEnvError(str(e)) from e


def load_stack(directory: Path | None = None) -> Stack:
    env_file = (directory or stack_dir()) / "stack.env"
    values = read_env_file(env_file)

    def get(key: str) -> str:
        try:
            return values[key]
        except KeyError:
            raise StackEnvError(f"{env_file}: {key} is missing") from None

    return Stack(
        kubeconfig=Path(get("KUBECONFIG")),
        reclaimd_kubeconfig=Path(get("RECLAIMD_KUBECONFIG")),
        kafka_bootstrap=get("KAFKA_BOOTSTRAP"),
        aws_endpoint=get("AWS_ENDPOINT_URL"),
        pubsub_host=get("PUBSUB_EMULATOR_HOST"),
        pubsub_project=get("PUBSUB_PROJECT_ID"),
        imds_url=get("IMDS_URL"),
        stack_dir=Path(get("STACK_DIR")),
    )


def client_env(directory: Path | None = None) -> dict[str, str]:
    """The environment variables that point SDK clients at the stack's emulators."""
    env_file = (directory or stack_dir()) / "stack.env"
    values = read_env_file(env_file)
    missing = [k for k in CLIENT_ENV_KEYS if k not in values]
    if missing:
        raise StackEnvError(f"{env_file}: missing {', '.join(missing)}")
    return {k: values[k] for k in CLIENT_ENV_KEYS}
