"""Server-side apply of YAML manifests, as ``kubectl apply --server-side`` would."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.dynamic import DynamicClient

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
