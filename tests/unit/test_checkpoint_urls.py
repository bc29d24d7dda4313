"""The checkpoint-URL guard: by default reclaimd POSTs only to the pod's own IP; an operator's
allowlist (hosts, IPs, CIDRs) names the exceptions, and a bad allowlist entry is one line."""

from __future__ import annotations

from typing import Any

import pytest

from reclaimd import annotations as ann
from reclaimd.cluster import gangs

POD_IP = "10.1.2.3"


def expand(template: str, policy: ann.UrlPolicy = ann.POD_IP_ONLY, ip: str = POD_IP) -> str:
    return ann.expand_url(template, ip, "team-a", "llama-0", policy=policy)


@pytest.mark.parametrize(
    "template",
    [
        "http://10.9.9.9/c",  # another pod
        "http://169.254.169.254/latest/meta-data/",  # the instance metadata service
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://kubernetes.default.svc/api",
        "http://127.0.0.1:10250/pods",  # the kubelet, seen from a hostNetwork reclaimd
        "http://[::1]:8080/c",
        "http://2130706433/c",  # 127.0.0.1 as a decimal host
        "http://0x7f000001/c",
        "http://10.1.2.3.nip.io/c",  # a name that resolves to the pod's IP is still a name
        "http://[::ffff:10.1.2.3]/c",  # the pod's IP mapped into IPv6 is another address
    ],
)
def test_only_the_pod_ip_by_default(template: str) -> None:
    with pytest.raises(ValueError, match="pod's own IP or an allowed host") as e:
        expand(template)
    assert "\n" not in str(e.value)


def test_the_pod_ip_passes_literal_or_templated() -> None:
    assert expand("http://{pod_ip}:8080/c") == "http://10.1.2.3:8080/c"
    assert expand("http://10.1.2.3:8080/c") == "http://10.1.2.3:8080/c"
    assert expand("http://{pod_ip}/c", ip="fd00::5") == "http://[fd00::5]/c"


def test_an_allowlist_admits_hosts_ips_and_networks() -> None:
    policy = ann.UrlPolicy.parse(["127.0.0.1", "10.200.0.0/16", "Ckpt.Internal", "fd00:1::/64"])
    assert expand("http://127.0.0.1:9000/c", policy) == "http://127.0.0.1:9000/c"
    assert expand("http://10.200.7.7/c", policy) == "http://10.200.7.7/c"
    assert expand("https://ckpt.internal/c", policy) == "https://ckpt.internal/c"
    assert expand("http://[fd00:1::9]/c", policy) == "http://[fd00:1::9]/c"
    assert expand("http://{pod_ip}/c", policy) == "http://10.1.2.3/c"
    for refused in ("http://127.0.0.2/c", "http://10.201.0.1/c", "http://ckpt.internal.evil/c"):
        with pytest.raises(ValueError, match="allowed host"):
            expand(refused, policy)


def test_switched_off_any_host_passes() -> None:
    policy = ann.UrlPolicy.parse([], require_pod_ip=False)
    assert expand("https://ckpt.team-a.svc/c", policy) == "https://ckpt.team-a.svc/c"
    with pytest.raises(ValueError, match="http or https"):
        expand("file:///etc/passwd", policy)  # the other checks stay


@pytest.mark.parametrize(
    "entry", ["10.0.0.1/8", "http://x", "a b", "", "*.svc", "host/path", "127.1", "-x", "x" * 300]
)
def test_a_bad_allowlist_entry_is_one_line(entry: str) -> None:
    with pytest.raises(ValueError, match="not a host name, IP address or CIDR") as e:
        ann.UrlPolicy.parse([entry])
    assert "\n" not in str(e.value)


def pod(url: str, ip: str = POD_IP) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "llama-0",
            "namespace": "team-a",
            "uid": "u0",
            "annotations": {ann.CHECKPOINT_URL: url},
        },
        "spec": {"nodeName": "n1", "containers": []},
        "status": {"podIP": ip, "phase": "Running"},
    }


def test_a_gang_member_aimed_elsewhere_is_not_opted_in() -> None:
    assert gangs.member_of(pod("http://169.254.169.254/")).checkpoint_url == ""
    assert gangs.member_of(pod("http://{pod_ip}/c")).checkpoint_url == "http://10.1.2.3/c"
    loopback = ann.UrlPolicy.parse(["127.0.0.1"])
    member = gangs.member_of(pod("http://127.0.0.1:7000/c"), url_policy=loopback)
    assert member.checkpoint_url == "http://127.0.0.1:7000/c"


def test_the_guard_can_be_turned_off() -> None:
    member = gangs.member_of(pod("http://ckpt.svc/c"), url_policy=ann.ANY_HOST)
    assert member.checkpoint_url == "http://ckpt.svc/c"
