"""The one Kueue Workload API version discovery (reclaimd/kueueapi.py) against the real
apiserver with Kueue's CRDs: the storage version is found, every part asking with the same
client shares one discovery, and ``forget`` makes the next ask discover again."""

from __future__ import annotations

import asyncio

import pytest

from reclaimd import kueueapi
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.kubeconfig import Connection


@pytest.fixture
def discoveries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts the discovery requests the module makes (each still reaches the apiserver)."""
    calls: list[str] = []
    real = kueueapi.served_versions

    async def counted(api: ApiServer, group: str = kueueapi.GROUP) -> list[str]:
        calls.append(group)
        return await real(api, group)

    monkeypatch.setattr(kueueapi, "served_versions", counted)
    return calls


async def test_the_stacks_kueue_serves_both_and_the_storage_version_wins(
    api: ApiServer,
) -> None:
    served = await kueueapi.served_versions(api)
    assert {"v1beta1", "v1beta2"} <= set(served)
    assert await kueueapi.WorkloadVersion(api).get() == "v1beta2"


async def test_every_part_shares_one_discovery(api: ApiServer, discoveries: list[str]) -> None:
    versions = kueueapi.WorkloadVersion(api)
    got = await asyncio.gather(*(versions.get() for _ in range(8)))
    assert got == ["v1beta2"] * 8
    assert discoveries == [kueueapi.GROUP]  # eight asks, one request
    assert versions.known == "v1beta2"
    assert kueueapi.shared(api) is kueueapi.shared(api)


async def test_forget_discovers_again(api: ApiServer, discoveries: list[str]) -> None:
    versions = kueueapi.WorkloadVersion(api)
    await versions.get()
    versions.forget()
    assert versions.known == ""
    assert await versions.get() == "v1beta2"
    assert len(discoveries) == 2


async def test_a_group_the_cluster_does_not_serve_has_no_versions(
    api: ApiServer,
) -> None:
    assert await kueueapi.served_versions(api, "nothing.example.com") == []


async def test_version_or_answers_the_served_version_and_falls_back_when_discovery_fails(
    api: ApiServer,
) -> None:
    assert await kueueapi.version_or(api, "v1beta1") == "v1beta2"
    unreachable = ApiServer.open(Connection("http://127.0.0.1:1", False))
    try:
        assert await kueueapi.version_or(unreachable, "v1beta1") == "v1beta1"
    finally:
        await unreachable.close()
