"""The pod annotations of the checkpoint contract, and the pure helpers that read them.

A pod opts in to "checkpoint on notice" by naming a URL; everything else is optional. The
cluster side calls ``read_pod`` (or the single parsers) when it turns a pod into a
``model.Member``: a bad annotation never fails the gang, it degrades that one pod to "not opted
in" (or to the default of the bad field) and is reported as a one-line problem.

The URL is written by the workload, so it is treated as untrusted input: only ``{pod_ip}``,
``{namespace}`` and ``{pod}`` are substituted (never ``str.format``, which would let a template
reach attributes), only http/https is accepted, credentials in the URL are refused (they would
end up in logs), and by default (``UrlPolicy.require_pod_ip``) reclaimd only ever POSTs to the
pod's own IP, so an annotation cannot aim reclaimd at another service; the exceptions an
operator allows (a sidecar's hostname, a loopback trainer in a drill) are an explicit
allowlist of hosts and CIDRs.

``last-checkpoint`` with ``checkpoint-durable: "false"`` records a stash that dies with the
node; only a durable one resets the restart-waste clock, so ``PodContract.last_durable_checkpoint``
is what belongs in ``Member.last_checkpoint``. A missing ``checkpoint-durable`` means durable,
because the annotation predates the flag and names "the last good checkpoint".
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from reclaimd.model import CheckpointScope, ParseError, parse_time, rfc3339

PREFIX = "reclaimd.io/"
CHECKPOINT_URL = PREFIX + "checkpoint-url"
CHECKPOINT_TIMEOUT = PREFIX + "checkpoint-timeout"
CHECKPOINT_SCOPE = PREFIX + "checkpoint-scope"
LAST_CHECKPOINT = PREFIX + "last-checkpoint"
CHECKPOINT_DURABLE = PREFIX + "checkpoint-durable"
RANK = PREFIX + "rank"
LEADER = PREFIX + "leader"

ALL = (
    CHECKPOINT_URL,
    CHECKPOINT_TIMEOUT,
    CHECKPOINT_SCOPE,
    LAST_CHECKPOINT,
    CHECKPOINT_DURABLE,
    RANK,
    LEADER,
)

_MAX_TEMPLATE = 2048
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
# Kubernetes names are DNS-1123 labels/subdomains: safe in a URL path without quoting.
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|h|m|s))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_UNIT_ORDER = ("h", "m", "s", "ms")
_MAX_RANK = 1_000_000


_HOSTNAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _show(value: str) -> str:
    return repr(value[:60])


@dataclass(frozen=True)
class UrlPolicy:
    """Which hosts a checkpoint URL may name.

    ``require_pod_ip`` (the default): the pod's own IP, or a host on the allowlist (a
    hostname, matched exactly, or an address in one of ``networks``). Off: any host, as
    before the guard existed; only for a cluster whose workloads are all trusted.
    """

    require_pod_ip: bool = True
    hostnames: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, allowed: Iterable[str], *, require_pod_ip: bool = True) -> UrlPolicy:
        """From allowlist entries (``127.0.0.1``, ``10.0.0.0/8``, ``ckpt.internal``);
        ``ValueError`` (one line) naming the first entry that is none of those."""
        hostnames: set[str] = set()
        networks: list[IPNetwork] = []
        for entry in allowed:
            text = entry.strip().lower()
            try:
                networks.append(ipaddress.ip_network(text, strict=True))
                continue
            except ValueError:
                pass
            if "/" in text or ":" in text or not _HOSTNAME.fullmatch(text) or len(text) > 253:
                raise ValueError(f"not a host name, IP address or CIDR: {_show(entry)}")
            if text.replace(".", "").isdigit():  # 127.1, 2130706433: IPs that ip_network refuses
                raise ValueError(f"not a host name, IP address or CIDR: {_show(entry)}")
            hostnames.add(text)
        return cls(require_pod_ip, frozenset(hostnames), tuple(networks))

    def allows(
        self, host: str, pod_ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    ) -> bool:
        if not self.require_pod_ip:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return host.lower().rstrip(".") in self.hostnames
        return address == pod_ip or any(address in net for net in self.networks)


POD_IP_ONLY = UrlPolicy()
ANY_HOST = UrlPolicy(require_pod_ip=False)


def expand_url(
    template: str,
    pod_ip: str,
    namespace: str,
    name: str,
    *,
    policy: UrlPolicy = POD_IP_ONLY,
) -> str:
    """The checkpoint URL of one pod, from its ``checkpoint-url`` template.

    Raises ``ValueError`` (one line) for an unknown placeholder, a scheme other than http or
    https, credentials in the URL, a template that expands to no host (e.g. ``{pod_ip}`` before
    the pod has an IP), or a host the ``policy`` does not allow (by default: any host but
    the pod's own IP).
    """
    text = template.strip()
    if not text:
        raise ValueError("checkpoint-url is empty")
    if len(text) > _MAX_TEMPLATE or any(c.isspace() or ord(c) < 32 for c in text):
        raise ValueError(f"checkpoint-url is not a URL: {_show(text)}")
    ip = _pod_ip(pod_ip) if pod_ip else None

    def substitute(m: re.Match[str]) -> str:
        key = m.group(1)
        if key == "pod_ip":
            if ip is None:
                raise ValueError("checkpoint-url uses {pod_ip} but the pod has no IP yet")
            # An IPv6 address is only a host when bracketed; keep a template's own brackets.
            bracketed = (
                text[m.start() - 1 : m.start()] == "[" and text[m.end() : m.end() + 1] == "]"
            )
            return f"[{ip}]" if ip.version == 6 and not bracketed else str(ip)
        if key == "namespace":
            return _k8s_name(namespace, "namespace")
        if key == "pod":
            return _k8s_name(name, "pod name")
        raise ValueError(f"checkpoint-url has an unknown placeholder {{{key[:40]}}}")

    url = _PLACEHOLDER.sub(substitute, text)
    if "{" in url or "}" in url:
        raise ValueError(f"checkpoint-url has an unbalanced brace: {_show(text)}")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port  # urlsplit checks the port only when it is read
    except ValueError as e:
        raise ValueError(f"checkpoint-url is not a URL: {_show(url)} ({e})") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"checkpoint-url must be http or https, not {_show(parts.scheme)}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("checkpoint-url must not carry credentials")
    if not host:
        raise ValueError(f"checkpoint-url expands to no host: {_show(url)}")
    if not policy.allows(host, ip):
        raise ValueError(
            f"checkpoint-url must point at the pod's own IP or an allowed host, not {_show(host)}"
        )
    return url


def _pod_ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(value.strip())
    except ValueError:
        raise ValueError(f"pod IP is not an IP address: {_show(value)}") from None


def _k8s_name(value: str, what: str) -> str:
    if not _K8S_NAME.fullmatch(value) or len(value) > 253:
        raise ValueError(f"{what} is not a Kubernetes name: {_show(value)}")
    return value


def parse_duration(value: str) -> float:
    """Seconds in a Go-style duration: ``45s``, ``2m``, ``1m30s``, ``500ms``, ``1.5s``.

    Units go from largest to smallest, each at most once; the result must be positive. A bare
    number is refused because its unit would be a guess.
    """
    text = value.strip()
    if len(text) > 32 or not _DURATION.fullmatch(text):
        raise ValueError(f"not a duration (like 45s, 2m, 1m30s, 500ms): {_show(value)}")
    total = 0.0
    last = -1
    for number, unit in _DURATION_PART.findall(text):
        index = _UNIT_ORDER.index(unit)
        if index <= last:
            raise ValueError(f"duration units out of order or repeated: {_show(value)}")
        last = index
        total += float(number) * _UNIT_S[unit]
    if total <= 0:
        raise ValueError(f"duration must be positive: {_show(value)}")
    return total


def parse_scope(value: str | None) -> CheckpointScope:
    """``rank`` (the default when absent) or ``leader``, case-insensitive."""
    if value is None or not value.strip():
        return CheckpointScope.RANK
    try:
        return CheckpointScope(value.strip().lower())
    except ValueError:
        raise ValueError(f"checkpoint-scope must be rank or leader, not {_show(value)}") from None


def parse_rank(value: str) -> int:
    text = value.strip()
    if not text.isdigit() or not text.isascii() or int(text) > _MAX_RANK:
        raise ValueError(f"rank must be a non-negative integer, not {_show(value)}")
    return int(text)


def parse_flag(value: str) -> bool:
    """``true`` or ``false``, case-insensitive; anything else is a mistake worth reporting."""
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"expected true or false, not {_show(value)}")
    return text == "true"


@dataclass(frozen=True)
class PodContract:
    """What one pod's annotations say about the contract; ``problems`` lists what was ignored."""

    checkpoint_url: str = ""  # expanded; empty when the pod did not (validly) opt in
    checkpoint_timeout_s: float = 0.0  # 0: the pod named no timeout, the budget alone bounds it
    scope: CheckpointScope = CheckpointScope.RANK
    last_checkpoint: datetime | None = None
    last_checkpoint_durable: bool = True
    rank: int | None = None
    is_leader: bool = False
    problems: tuple[str, ...] = ()

    @property
    def last_durable_checkpoint(self) -> datetime | None:
        return self.last_checkpoint if self.last_checkpoint_durable else None


def read_pod(
    annotations: Mapping[str, str],
    *,
    pod_ip: str,
    namespace: str,
    name: str,
    policy: UrlPolicy = POD_IP_ONLY,
) -> PodContract:
    """Every contract annotation of one pod; a bad value is dropped and named in ``problems``."""
    problems: list[str] = []
    url = ""
    timeout_s = 0.0
    scope = CheckpointScope.RANK
    last: datetime | None = None
    durable = True
    rank: int | None = None
    leader = False
    if CHECKPOINT_URL in annotations:
        try:
            url = expand_url(annotations[CHECKPOINT_URL], pod_ip, namespace, name, policy=policy)
        except ValueError as e:
            problems.append(str(e))
    if CHECKPOINT_TIMEOUT in annotations:
        try:
            timeout_s = parse_duration(annotations[CHECKPOINT_TIMEOUT])
        except ValueError as e:
            problems.append(f"checkpoint-timeout: {e}")
    try:
        scope = parse_scope(annotations.get(CHECKPOINT_SCOPE))
    except ValueError as e:
        problems.append(str(e))
    if LAST_CHECKPOINT in annotations:
        try:
            last = parse_time(annotations[LAST_CHECKPOINT])
        except ParseError as e:
            problems.append(f"last-checkpoint: {e}")
    if CHECKPOINT_DURABLE in annotations:
        try:
            durable = parse_flag(annotations[CHECKPOINT_DURABLE])
        except ValueError as e:
            # Unknown durability must not reset the waste clock.
            durable = False
            problems.append(f"checkpoint-durable: {e}")
    if RANK in annotations:
        try:
            rank = parse_rank(annotations[RANK])
        except ValueError as e:
            problems.append(str(e))
    if LEADER in annotations:
        try:
            leader = parse_flag(annotations[LEADER])
        except ValueError as e:
            problems.append(f"leader: {e}")
    return PodContract(
        checkpoint_url=url,
        checkpoint_timeout_s=timeout_s,
        scope=scope,
        last_checkpoint=last,
        last_checkpoint_durable=durable,
        rank=rank,
        is_leader=leader,
        problems=tuple(problems),
    )


def last_checkpoint_patch(checkpoint_time: datetime, *, durable: bool) -> dict[str, str]:
    """The annotations reclaimd writes on a pod after an ack (a merge patch's ``annotations``).

    Only a durable checkpoint is recorded: writing a stash's time would hide the older durable
    checkpoint that restart waste is still counted from.
    """
    if not durable:
        return {}
    return {LAST_CHECKPOINT: rfc3339(checkpoint_time), CHECKPOINT_DURABLE: "true"}
