"""The rig's Kubernetes client (the generated one), and server-side apply of YAML manifests,
as ``kubectl apply --server-side`` would.

The product speaks to the API server through its own small ``ApiServer``; the rig builds
fleets, pods and RBAC with the whole generated client, which the product does not import.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.dynamic import DynamicClient

from reclaimd.cluster.errors import MESSAGE_LIMIT, ConfigError

FIELD_MANAGER = "reclaimd-local"


async def apply_documents(api: k8s.ApiClient, docs: list[dict[str, Any]]) -> list[str]:
    """Apply each object; returns ``kind/name`` of each, in order."""
    dyn = await DynamicClient(api)
    applied = []
    for doc in docs:
        resource = await dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        await dyn.server_side_apply(
            resource,
            body=doc,
            namespace=doc["metadata"].get("namespace"),
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
        )
        applied.append(f"{doc['kind']}/{doc['metadata']['name']}")
    return applied


async def apply_file(api: k8s.ApiClient, path: Path) -> list[str]:
    text = await asyncio.to_thread(path.read_text)
    docs = [d for d in yaml.safe_load_all(text) if d]
    return await apply_documents(api, docs)


async def rig_client(
    kubeconfig: str | None = None, *, context: str | None = None, pool_size: int = 64
) -> k8s.ApiClient:
    """A generated ``ApiClient`` from ``kubeconfig``, else in-cluster config, else
    ``$KUBECONFIG``; ``ConfigError`` (one line) when none is usable."""
    configuration = k8s.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        else:
            await k8s_config.load_kube_config(
                config_file=kubeconfig or os.environ.get("KUBECONFIG") or None,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
    except (k8s_config.ConfigException, OSError, ValueError, TypeError, KeyError) as e:
        reason = str(e).splitlines()[0][:MESSAGE_LIMIT] if str(e) else type(e).__name__
        raise ConfigError("load Kubernetes config", 0, reason) from e
    # The generated client's pool defaults to 5 x CPUs connections: far below a storm's.
    configuration.connection_pool_maxsize = pool_size
    return k8s.ApiClient(configuration=configuration)
