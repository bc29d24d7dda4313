"""The one Kueue Workload API version discovery (reclaimd/kueueapi.py) against the real
apiserver with Kueue's CRDs: the storage version is found, every part asking with the same
client shares one discovery, and ``forget`` makes the next ask discover again."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client

from reclaimd import kueueapi


@pytest.fixture
def discoveries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts the discovery requests the module makes (each still reaches the apiserver)."""
    calls: list[str] = []
    real = kueueapi.served_versions

    async def counted(api: client.ApiClient, group: str = kueueapi.GROUP) -> list[str]:
        calls.append(group)
        return await real(api, group)

    monkeypatch.setattr(kueueapi, "served_versions", counted)
    return calls


async def test_the_stacks_kueue_serves_both_and_the_storage_version_wins(
    kube: client.ApiClient,
) -> None:
    served = await kueueapi.served_versions(kube)
    assert {"v1beta1", "v1beta2"} <= set(served)
    assert await kueueapi.WorkloadVersion(kube).get() == "v1beta2"


async def test_every_part_shares_one_discovery(
    kube: client.ApiClient, discoveries: list[str]
) -> None:
    versions = kueueapi.WorkloadVersion(kube)
    got = await asyncio.gather(*(versions.get() for _ in range(8)))
    assert got == ["v1beta2"] * 8
    assert discoveries == [kueueapi.GROUP]  # eight asks, one request
    assert versions.known == "v1beta2"
    assert kueueapi.shared(kube) is kueueapi.shared(kube)


async def test_forget_discovers_again(kube: client.ApiClient, discoveries: list[str]) -> None:
    versions = kueueapi.WorkloadVersion(kube)
    await versions.get()
    versions.forget()
    assert versions.known == ""
    assert await versions.get() == "v1beta2"
    assert len(discoveries) == 2


async def test_a_group_the_cluster_does_not_serve_has_no_versions(
    kube: client.ApiClient,
) -> None:
    assert await kueueapi.served_versions(kube, "nothing.example.com") == []


async def test_version_or_answers_the_served_version_and_falls_back_when_discovery_fails(
    kube: client.ApiClient,
) -> None:
    assert await kueueapi.version_or(kube, "v1beta1") == "v1beta2"
    unreachable = client.ApiClient(client.Configuration(host="http://127.0.0.1:1"))
    try:
        assert await kueueapi.version_or(unreachable, "v1beta1") == "v1beta1"
    finally:
        await unreachable.close()
