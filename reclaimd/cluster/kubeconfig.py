"""Where the API server is and who we are to it: a kubeconfig, or the pod's service account.

What ``kubectl`` reads, in the part a controller needs: the context's cluster (``server``, its
CA as a file or inline, or ``insecure-skip-tls-verify``) and user (a client certificate and
key, a bearer token or token file, or an ``exec`` credential plugin as EKS, GKE and AKS
kubeconfigs use). In a pod, the service account's token, CA and
``KUBERNETES_SERVICE_HOST``/``PORT``. Tokens are read again as they age (a projected
service-account token is rotated on disk; an exec credential expires), never logged.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# How long a token read from a file is used before the file is read again (client-go: 1 min).
TOKEN_FILE_TTL_S = 60.0
# An exec credential is fetched again this long before it says it expires.
EXEC_EARLY_S = 30.0
EXEC_TIMEOUT_S = 60.0


class KubeconfigError(Exception):
    """No usable configuration; the message is one line and names no secret."""


@dataclass
class Token:
    """A bearer token: fixed, read from a file, or handed out by an exec plugin."""

    value: str = ""
    path: Path | None = None
    exec_spec: Mapping[str, Any] | None = None
    exec_dir: Path | None = None
    _expires: float = field(default=0.0, repr=False)
    _lock: asyncio.Lock | None = field(default=None, repr=False)

    async def get(self) -> str:
        if self.path is None and self.exec_spec is None:
            return self.value
        if self.value and time.monotonic() < self._expires:
            return self.value
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self.value or time.monotonic() >= self._expires:
                if self.path is not None:
                    self.value = (await asyncio.to_thread(self.path.read_text)).strip()
                    self._expires = time.monotonic() + TOKEN_FILE_TTL_S
                else:
                    self.value, self._expires = await _run_exec(self.exec_spec or {}, self.exec_dir)
        return self.value


@dataclass
class Connection:
    """The API server's address, how its certificate is checked, and our credentials."""

    server: str
    ssl: ssl.SSLContext | bool
    token: Token | None = None


def load(kubeconfig: str | None = None, context: str | None = None) -> Connection:
    """``kubeconfig``, else the pod's service account (in a pod), else ``$KUBECONFIG``, else
    ``~/.kube/config``."""
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster()
    if kubeconfig:
        paths = [Path(kubeconfig)]
    else:
        listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
        paths = [Path(p) for p in listed] or [Path.home() / ".kube" / "config"]
    return from_kubeconfig(paths, context)


def in_cluster(sa_dir: Path = SA_DIR) -> Connection:
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    token_path, ca_path = sa_dir / "token", sa_dir / "ca.crt"
    if not host or not token_path.is_file() or not ca_path.is_file():
        raise KubeconfigError(f"no in-cluster service account at {sa_dir}")
    if ":" in host:
        host = f"[{host}]"  # IPv6
    try:
        context = ssl.create_default_context(cafile=str(ca_path))
    except (OSError, ssl.SSLError) as e:
        raise KubeconfigError(f"service account CA unreadable: {type(e).__name__}") from e
    return Connection(f"https://{host}:{port}", context, Token(path=token_path))


def from_kubeconfig(paths: list[Path], context: str | None = None) -> Connection:
    docs: list[tuple[Path, Mapping[str, Any]]] = []
    for path in paths:
        try:
            doc = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            continue
        except (OSError, yaml.YAMLError) as e:
            raise KubeconfigError(f"kubeconfig {path} unreadable: {type(e).__name__}") from e
        if isinstance(doc, Mapping):
            docs.append((path, doc))
    if not docs:
        raise KubeconfigError(f"no kubeconfig at {', '.join(map(str, paths))}")
    # Merged as kubectl merges $KUBECONFIG: the first file to name a thing wins.
    name = context or next(
        (str(d["current-context"]) for _, d in docs if d.get("current-context")), ""
    )
    ctx, _ = _named(docs, "contexts", "context", name)
    if ctx is None:
        raise KubeconfigError(f"kubeconfig has no context {name!r}")
    cluster, cluster_dir = _named(docs, "clusters", "cluster", str(ctx.get("cluster") or ""))
    user, user_dir = _named(docs, "users", "user", str(ctx.get("user") or ""))
    if cluster is None or not cluster.get("server"):
        raise KubeconfigError(f"kubeconfig context {name!r} names no cluster with a server")
    return _connection(cluster, cluster_dir, user or {}, user_dir)


def _named(
    docs: list[tuple[Path, Mapping[str, Any]]], section: str, key: str, name: str
) -> tuple[Mapping[str, Any] | None, Path]:
    for path, doc in docs:
        for entry in doc.get(section) or ():
            if isinstance(entry, Mapping) and entry.get("name") == name:
                body = entry.get(key)
                return (body if isinstance(body, Mapping) else {}), path.parent
    return None, Path(".")


def _connection(
    cluster: Mapping[str, Any], cluster_dir: Path, user: Mapping[str, Any], user_dir: Path
) -> Connection:
    server = str(cluster["server"]).rstrip("/")
    verify: ssl.SSLContext | bool
    if cluster.get("insecure-skip-tls-verify"):
        verify = False
    else:
        try:
            verify = ssl.create_default_context(
                cafile=_path(cluster.get("certificate-authority"), cluster_dir),
                cadata=_decoded(cluster.get("certificate-authority-data")),
            )
        except (OSError, ssl.SSLError, ValueError) as e:
            raise KubeconfigError(f"cluster CA unusable: {type(e).__name__}") from e
    if user.get("auth-provider"):
        raise KubeconfigError("kubeconfig auth-provider is not supported: use an exec plugin")
    cert = _decoded(user.get("client-certificate-data")) or _read(
        user, "client-certificate", user_dir
    )
    key = _decoded(user.get("client-key-data")) or _read(user, "client-key", user_dir)
    if cert and key:
        if not isinstance(verify, ssl.SSLContext):
            verify = ssl.create_default_context()
            verify.check_hostname, verify.verify_mode = False, ssl.CERT_NONE
        _load_pair(verify, cert, key)
    token: Token | None = None
    if user.get("token"):
        token = Token(value=str(user["token"]))
    elif user.get("tokenFile"):
        token = Token(path=Path(_path(user["tokenFile"], user_dir) or ""))
    elif isinstance(user.get("exec"), Mapping):
        token = Token(exec_spec=user["exec"], exec_dir=user_dir)
    return Connection(server, verify, token)


def _path(value: Any, base: Path) -> str | None:
    return str(base / str(value)) if value else None  # relative to the kubeconfig's folder


def _decoded(value: Any) -> str | None:
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True).decode()
    except (ValueError, UnicodeDecodeError) as e:
        raise KubeconfigError("kubeconfig holds undecodable base64 data") from e


def _read(user: Mapping[str, Any], key: str, base: Path) -> str | None:
    path = _path(user.get(key), base)
    if path is None:
        return None
    try:
        return Path(path).read_text()
    except OSError as e:
        raise KubeconfigError(f"kubeconfig {key} unreadable: {type(e).__name__}") from e


def _load_pair(context: ssl.SSLContext, cert: str, key: str) -> None:
    # ssl reads a key pair only from files: a private folder for the moment it takes.
    with tempfile.TemporaryDirectory(prefix="reclaimd-kube-") as folder:
        cert_path, key_path = Path(folder, "tls.crt"), Path(folder, "tls.key")
        cert_path.write_text(cert)
        key_path.touch(mode=0o600)
        key_path.write_text(key)
        try:
            context.load_cert_chain(cert_path, key_path)
        except (OSError, ssl.SSLError) as e:
            raise KubeconfigError(f"client certificate unusable: {type(e).__name__}") from e


async def _run_exec(spec: Mapping[str, Any], cwd: Path | None) -> tuple[str, float]:
    """Run a client-go credential plugin; its ``ExecCredential`` token, and until when."""
    command = str(spec.get("command") or "")
    if not command:
        raise KubeconfigError("kubeconfig exec plugin names no command")
    env = dict(os.environ)
    for item in spec.get("env") or ():
        if isinstance(item, Mapping) and item.get("name"):
            env[str(item["name"])] = str(item.get("value") or "")
    api_version = str(spec.get("apiVersion") or "client.authentication.k8s.io/v1")
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        {"apiVersion": api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
    )
    try:
        proc = await asyncio.create_subprocess_exec(
            command,
            *map(str, spec.get("args") or ()),
            env=env,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        async with asyncio.timeout(EXEC_TIMEOUT_S):
            out, _ = await proc.communicate()
    except (OSError, TimeoutError) as e:
        raise KubeconfigError(f"exec plugin {command} failed: {type(e).__name__}") from e
    if proc.returncode != 0:
        raise KubeconfigError(f"exec plugin {command} exited {proc.returncode}")
    try:
        status = json.loads(out).get("status") or {}
    except (ValueError, AttributeError) as e:
        raise KubeconfigError(f"exec plugin {command} printed no ExecCredential") from e
    if not status.get("token"):
        raise KubeconfigError(
            f"exec plugin {command} gave no token (client certificates unsupported)"
        )
    expires = time.monotonic() + 3600.0
    if status.get("expirationTimestamp"):
        try:
            at = datetime.fromisoformat(str(status["expirationTimestamp"]).replace("Z", "+00:00"))
            expires = time.monotonic() + max(0.0, at.timestamp() - time.time() - EXEC_EARLY_S)
        except ValueError:
            pass
    return str(status["token"]), expires
