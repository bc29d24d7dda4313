"""How reclaimd's ``ApiServer`` is built: from a kubeconfig, else the pod's service account."""

from __future__ import annotations

from reclaimd.cluster import kubeconfig
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.errors import MESSAGE_LIMIT, ConfigError


async def build_api_client(
    kubeconfig_path: str | None = None, *, context: str | None = None, pool_size: int = 64
) -> ApiServer:
    """An ``ApiServer`` from ``kubeconfig_path``, else in-cluster config, else ``$KUBECONFIG``.

    In a pod (``KUBERNETES_SERVICE_HOST`` set, no path given) the service account is used, so
    the RBAC in ``deploy/kubernetes/rbac.yaml`` is what the daemon can do.
    """
    try:
        connection = kubeconfig.load(kubeconfig_path, context)
    except kubeconfig.KubeconfigError as e:
        raise ConfigError("load Kubernetes config", 0, str(e)[:MESSAGE_LIMIT]) from e
    return ApiServer.open(connection, pool_size)
