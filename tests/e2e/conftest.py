"""Fixtures for tests that run against the real local stack (``deploy/local/stack.sh``).

Every test under ``tests/e2e`` is marked ``e2e`` and gets the session ``stack``: a running stack
is reused (``stack.sh status`` exits 0), otherwise ``stack.sh up`` starts it. A component that
cannot start fails the run; it is never a skip, so a green e2e run means every server was real.
The fixture also exports the variables boto3, the Pub/Sub client and reclaimd's own settings read
(``AWS_ENDPOINT_URL``, ``PUBSUB_EMULATOR_HOST``, ...) for the whole session.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config
from stack import REPO_DIR, Stack, StackEnvError, client_env, load_stack

from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.connect import build_api_client

E2E_DIR = Path(__file__).resolve().parent
STACK_SH = REPO_DIR / "deploy" / "local" / "stack.sh"
# Long enough for a warm `up` from stopped; a cold one (builds) belongs in `make stack-up`.
STACK_UP_TIMEOUT_S = 280


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # This hook sees every collected item, not only this directory's, hence the path check.
    for item in items:
        if item.path.is_relative_to(E2E_DIR):
            item.add_marker(pytest.mark.e2e)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def _ensure_stack_running() -> None:
    status = subprocess.run([str(STACK_SH), "status"], capture_output=True, text=True, check=False)
    if status.returncode == 0:
        return
    try:
        up = subprocess.run(
            [str(STACK_SH), "up"],
            capture_output=True,
            text=True,
            check=False,
            timeout=STACK_UP_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"stack.sh up did not finish in {STACK_UP_TIMEOUT_S}s; run `make stack-up`",
            pytrace=False,
        )
    if up.returncode != 0:
        pytest.fail(f"stack.sh up failed: {_last_line(up.stderr or up.stdout)}", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def stack() -> Iterator[Stack]:
    _ensure_stack_running()
    try:
        loaded = load_stack()
        exported = client_env()
    except StackEnvError as e:
        pytest.fail(str(e), pytrace=False)
    with pytest.MonkeyPatch.context() as env:
        for key, value in exported.items():
            env.setenv(key, value)
        env.setenv("KUBECONFIG", str(loaded.kubeconfig))
        yield loaded


@pytest.fixture(scope="session")
async def kube(stack: Stack) -> AsyncIterator[client.ApiClient]:
    """An API client on the admin kubeconfig (group ``system:masters``)."""
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(stack.kubeconfig), client_configuration=configuration
    )
    async with client.ApiClient(configuration=configuration) as api:
        yield api


@pytest.fixture(scope="session")
async def api(stack: Stack) -> AsyncIterator[ApiServer]:
    """The product's own client (``ApiServer``) on the admin kubeconfig."""
    async with await build_api_client(str(stack.kubeconfig)) as server:
        yield server
