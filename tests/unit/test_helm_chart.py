"""The Helm chart as rendered by the real helm (built by deploy/helm/tools.sh): lint, what each
values combination renders, what the schema refuses, and deploy/kubernetes/ kept equal to it.

Acceptance by the API server (schemas, Pod Security) is tests/e2e/test_helm_install.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from reclaimd import config, handlers

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "reclaimd"
VERSIONS = REPO / "deploy" / "local" / "versions.env"


def _pin(name: str) -> str:
    for line in VERSIONS.read_text().splitlines():
        if line.startswith(name + "="):
            return line.split("=", 1)[1]
    raise AssertionError(f"{name} missing from {VERSIONS}")


CACHE = Path(os.environ.get("RECLAIMD_CACHE") or Path.home() / ".cache" / "reclaimd")
HELM = CACHE / f"helm-{_pin('HELM_VERSION')}" / "helm"
KUBE_VERSION = _pin("K8S_VERSION").lstrip("v")


@pytest.fixture(scope="module", autouse=True)
def helm() -> Path:
    if not HELM.is_file():
        pytest.fail(f"no helm at {HELM}: run deploy/helm/tools.sh", pytrace=False)
    return HELM


def run_helm(*args: str, values: dict[str, Any] | None = None, tmp: Path | None = None) -> str:
    cmd = [str(HELM), *args]
    if values is not None:
        assert tmp is not None
        path = tmp / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        cmd += ["-f", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if "found symbolic link" not in ln]
        raise HelmError("\n".join(lines) or "failed")
    return done.stdout


class HelmError(Exception):
    pass


# config.cluster_name is required (test_helm_defaults: refused without it); every other render
# names one unless its values do.
CLUSTER = "test-cluster"
QUEUE_URL = "https://sqs.us-east-2.amazonaws.com/123456789012/reclaimd"


def render(
    tmp_path: Path, values: dict[str, Any] | None = None, release: str = "reclaimd"
) -> list[dict[str, Any]]:
    values = dict(values or {})
    values["config"] = {"cluster_name": CLUSTER, **values.get("config", {})}
    out = run_helm(
        "template", release, str(CHART), "--namespace", "reclaimd",
        "--kube-version", KUBE_VERSION, values=values, tmp=tmp_path,
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def only(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def settings_of(cm: dict[str, Any], tmp_path: Path) -> config.Settings:
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    return config.load(path, env={})


def match_expressions(pod_spec: dict[str, Any]) -> Iterator[tuple[str, str, tuple[str, ...]]]:
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in terms["nodeSelectorTerms"]:
        for e in term["matchExpressions"]:
            yield e["key"], e["operator"], tuple(e.get("values", ()))


# --- lint and the default install ------------------------------------------------------------


def test_helm_lint_strict() -> None:
    out = run_helm(
        "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION,
        "--set", f"config.cluster_name={CLUSTER}",
    )  # fmt: skip
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_defaults_render_the_controller_only(tmp_path: Path) -> None:
    docs = render(tmp_path)
    assert kinds(docs) == sorted(
        [
            "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "NetworkPolicy",
            "PodDisruptionBudget", "ResourceQuota", "Role", "RoleBinding", "Service",
            "ServiceAccount",
        ]
    )  # fmt: skip


def test_controller_is_ha_and_never_on_reclaimable_nodes(tmp_path: Path) -> None:
    docs = render(tmp_path)
    dep = only(docs, "Deployment")
    spec = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert spec["priorityClassName"] == "system-cluster-critical"
    exprs = set(match_expressions(spec))
    assert ("karpenter.sh/capacity-type", "NotIn", ("spot",)) in exprs
    assert ("cloud.google.com/gke-spot", "NotIn", ("true",)) in exprs
    assert ("reclaimd.io/reclaimable", "NotIn", ("true",)) in exprs
    anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    assert anti[0]["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    pdb = only(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]


def test_pods_meet_the_restricted_pod_security_profile(tmp_path: Path) -> None:
    docs = render(tmp_path, {"nodeAgent": {"enabled": True}})
    for kind in ("Deployment", "DaemonSet"):
        spec = only(docs, kind)["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 65532
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "hostNetwork" not in spec
        (c,) = spec["containers"]
        assert c["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        probes = {p: c[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")}
        assert probes == {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}
        assert c["resources"]["requests"]["memory"]
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        # config, outbox, tmp, and reclaimd's projected token for the ranks (read-only)
        assert mounts == {
            "/etc/reclaimd", "/var/lib/reclaimd", "/tmp", "/var/run/secrets/reclaimd.io/checkpoint",
        }  # fmt: skip


def test_config_map_is_valid_reclaimd_settings(tmp_path: Path) -> None:
    sqs = {"enabled": True, "queue_url": QUEUE_URL}
    values = {"config": {"cluster_name": "prod-1", "sqs": sqs}}
    docs = render(tmp_path, values)
    s = settings_of(only(docs, "ConfigMap"), tmp_path)
    assert s.cluster_name == "prod-1"
    assert s.sqs.enabled
    assert s.lease_namespace == "reclaimd"  # the release namespace, where the Role allows
    assert str(s.ledger.outbox_path) == "/var/lib/reclaimd/outbox.sqlite"  # on the volume
    assert s.tracing.span_file is None  # nothing written on the read-only root


def test_pubsub_slots_follow_the_replicas_unless_set(tmp_path: Path) -> None:
    def slots(values: dict[str, Any]) -> int:
        # Pub/Sub enabled as reclaimd accepts it (a project and a subscription).
        pubsub = {"enabled": True, "project": "p", "subscription": "s"}
        config = values.setdefault("config", {})
        config["pubsub"] = {**pubsub, **config.get("pubsub", {})}
        cm = only(render(tmp_path, values), "ConfigMap")
        return settings_of(cm, tmp_path).pubsub.slots

    assert slots({}) == 2  # the default 2 replicas: a subscription each
    assert slots({"controller": {"replicas": 3}}) == 3
    # one subscription shared by every replica, as before slots
    assert slots({"config": {"pubsub": {"enabled": True, "slots": 1}}}) == 1


def test_a_config_change_rolls_the_pods(tmp_path: Path) -> None:
    def checksum(values: dict[str, Any]) -> str:
        dep = only(render(tmp_path, values), "Deployment")
        return str(dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum({}) != checksum({"config": {"cluster_name": "other"}})


def test_secrets_only_by_reference(tmp_path: Path) -> None:
    values = {
        "secretEnv": {"RECLAIMD_LEDGER__BOOTSTRAP": {"secretName": "kafka", "key": "bootstrap"}},
        "secretEnvFrom": ["reclaimd-extra"],
    }
    c = only(render(tmp_path, values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    secret_env = [e for e in c["env"] if e["name"] != "POD_IP"]  # the downward API's, below
    assert secret_env == [
        {
            "name": "RECLAIMD_LEDGER__BOOTSTRAP",
            "valueFrom": {"secretKeyRef": {"name": "kafka", "key": "bootstrap"}},
        }
    ]
    assert c["envFrom"] == [{"secretRef": {"name": "reclaimd-extra"}}]


def test_outbox_on_a_claim_when_asked(tmp_path: Path) -> None:
    values = {"controller": {"replicas": 1, "outbox": {"existingClaim": "reclaimd-outbox"}}}
    docs = render(tmp_path, values)
    vols = {v["name"]: v for v in only(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert vols["outbox"]["persistentVolumeClaim"] == {"claimName": "reclaimd-outbox"}
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]  # one replica: no PDB


# --- identity, RBAC --------------------------------------------------------------------------


def test_service_account_annotations_for_irsa_and_workload_identity(tmp_path: Path) -> None:
    arn = "arn:aws:iam::123456789012:role/reclaimd"
    gsa = "reclaimd@my-project.iam.gserviceaccount.com"
    values = {"serviceAccount": {"awsRoleArn": arn, "gcpServiceAccount": gsa}}
    sa = only(render(tmp_path, values), "ServiceAccount")
    assert sa["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": arn,
        "iam.gke.io/gcp-service-account": gsa,
    }


def test_aks_workload_identity_annotates_the_account_and_labels_the_pods(tmp_path: Path) -> None:
    client_id = "3f1c2b4a-8d7e-4f60-9a1b-2c3d4e5f6a7b"
    values = {"serviceAccount": {"azureClientId": client_id}, "nodeAgent": {"enabled": True}}
    docs = render(tmp_path, values)
    sa = only(docs, "ServiceAccount")
    assert sa["metadata"]["annotations"] == {"azure.workload.identity/client-id": client_id}
    for kind in ("Deployment", "DaemonSet"):
        labels = only(docs, kind)["spec"]["template"]["metadata"]["labels"]
        assert labels["azure.workload.identity/use"] == "true", kind
    # Off by default: no pod asks the webhook for a token it has no identity for.
    plain = render(tmp_path, {"nodeAgent": {"enabled": True}})
    for kind in ("Deployment", "DaemonSet"):
        labels = only(plain, kind)["spec"]["template"]["metadata"]["labels"]
        assert "azure.workload.identity/use" not in labels, kind


def test_rbac_grants_events_and_nothing_on_secrets(tmp_path: Path) -> None:
    docs = render(tmp_path)
    rules = only(docs, "ClusterRole")["rules"]
    assert {"apiGroups": ["events.k8s.io"], "resources": ["events"],
            "verbs": ["create", "patch"]} in rules  # fmt: skip
    assert not [r for r in rules if {"secrets", "configmaps"} & set(r["resources"])]
    assert not [r for r in rules if "*" in r["verbs"] or "*" in r["resources"]]
    role = only(docs, "Role")
    assert role["metadata"]["namespace"] == "reclaimd"
    assert role["rules"][0]["resources"] == ["leases"]


def test_names_follow_the_release(tmp_path: Path) -> None:
    docs = render(tmp_path, release="prod")
    assert only(docs, "ClusterRole")["metadata"]["name"] == "prod-reclaimd"
    binding = only(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "prod-reclaimd", "namespace": "reclaimd"}
    ]


def test_deploy_kubernetes_is_the_charts_render() -> None:
    done = subprocess.run(
        [str(REPO / "deploy" / "helm" / "render.sh"), "--check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "HELM": str(HELM)},
    )
    assert done.returncode == 0, done.stderr


# --- the node agent --------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "section"), [(e.agent, e.name) for e in handlers.AGENTS])
def test_node_agent_runs_only_on_reclaimable_nodes(
    tmp_path: Path, source: str, section: str
) -> None:
    values = {
        "nodeAgent": {"enabled": True, "source": source},
        "config": {"sqs": {"enabled": True, "queue_url": QUEUE_URL}, "kueue": {"enabled": True}},
    }
    docs = render(tmp_path, values)
    ds = only(docs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    # One term per reclaimable label: any of them is enough (terms are ORed).
    assert {"matchExpressions": [{"key": "karpenter.sh/capacity-type", "operator": "In",
            "values": ["spot"]}]} in terms["nodeSelectorTerms"]  # fmt: skip
    assert len(terms["nodeSelectorTerms"]) == 6
    tolerated = {t["key"] for t in spec["tolerations"]}
    assert {"reclaimd.io/interruption", "nvidia.com/gpu", "cloud.google.com/gke-spot"} <= tolerated
    assert spec["priorityClassName"] == "system-node-critical"
    s = settings_of(only(docs, "ConfigMap", "reclaimd-node-agent"), tmp_path)
    assert getattr(s, section).enabled
    # The queue sources belong to the controller: the agent never consumes them.
    assert not s.sqs.enabled and not s.kueue.enabled and not s.pubsub.enabled
    for other in handlers.AGENTS:
        assert getattr(s, other.name).enabled is (other.name == section)
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    for agent in handlers.AGENTS:
        named = env.get(f"RECLAIMD_{agent.name.upper()}__NODE_NAME")
        if agent.agent_node_name:
            assert named is not None, agent.name
            assert named["valueFrom"]["fieldRef"] == {"fieldPath": "spec.nodeName"}
        else:
            assert named is None, agent.name
    assert "RECLAIMD_GCE_METADATA__NODE_NAME" in env
    # The controller's own config is untouched.
    assert settings_of(only(docs, "ConfigMap", "reclaimd"), tmp_path).sqs.enabled


def test_host_network_for_imds_hop_limit_one(tmp_path: Path) -> None:
    docs = render(tmp_path, {"nodeAgent": {"enabled": True, "hostNetwork": True}})
    spec = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"


def test_node_agent_on_aks_spot_pools(tmp_path: Path) -> None:
    """Azure Scheduled Events on AKS Spot pools: scheduled by the pool's label, tolerating its
    taint, on the pod network (pods reach IMDS there), with its node name."""
    values = {"nodeAgent": {"enabled": True, "source": "azure-scheduled"}}
    docs = render(tmp_path, values)
    spec = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert ("kubernetes.azure.com/scalesetpriority", "In", ("spot",)) in set(
        match_expressions(spec)
    )
    taint = {
        "key": "kubernetes.azure.com/scalesetpriority",
        "value": "spot",
        "effect": "NoSchedule",
    }
    assert any(
        t["key"] == taint["key"]
        and (t["operator"] == "Exists" or t.get("value") == taint["value"])
        and t.get("effect", taint["effect"]) == taint["effect"]
        for t in spec["tolerations"]
    )
    assert "hostNetwork" not in spec
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    node = env["RECLAIMD_AZURE_SCHEDULED__NODE_NAME"]["valueFrom"]["fieldRef"]
    assert node == {"fieldPath": "spec.nodeName"}
    s = settings_of(only(docs, "ConfigMap", "reclaimd-node-agent"), tmp_path)
    assert s.azure_scheduled.enabled and s.azure_scheduled.url == "http://169.254.169.254"
    # The controller never runs on them.
    controller = only(docs, "Deployment")["spec"]["template"]["spec"]
    assert ("kubernetes.azure.com/scalesetpriority", "NotIn", ("spot",)) in set(
        match_expressions(controller)
    )
    # The NetworkPolicy lets the agent reach IMDS.
    np = only(docs, "NetworkPolicy", "reclaimd")
    assert any(
        rule.get("to") == [{"ipBlock": {"cidr": "169.254.169.254/32"}}]
        and rule["ports"] == [{"port": 80, "protocol": "TCP"}]
        for rule in np["spec"]["egress"]
    )


# --- network policies ------------------------------------------------------------------------


def test_reclaimd_egress_names_what_it_talks_to(tmp_path: Path) -> None:
    values = {"networkPolicy": {"kafka": {"cidrs": ["10.20.0.0/16"]}}}
    np = only(render(tmp_path, values), "NetworkPolicy")
    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
    ports = {(p["port"], p["protocol"]) for rule in np["spec"]["egress"] for p in rule["ports"]}
    assert {(53, "UDP"), (443, "TCP"), (6443, "TCP"), (9092, "TCP"), (80, "TCP"),
            (8080, "TCP")} <= ports  # fmt: skip
    kafka = [r for r in np["spec"]["egress"] if r["ports"][0]["port"] == 9092]
    assert kafka[0]["to"] == [{"ipBlock": {"cidr": "10.20.0.0/16"}}]
    assert [p["port"] for p in np["spec"]["ingress"][0]["ports"]] == ["metrics"]


def test_the_peer_probe_port_is_open_between_the_replicas_only(tmp_path: Path) -> None:
    docs = render(tmp_path, {})
    np = only(docs, "NetworkPolicy", "reclaimd")
    probe_in = [r for r in np["spec"]["ingress"] if r["ports"][0]["port"] == "peer-probe"]
    probe_out = [r for r in np["spec"]["egress"] if r["ports"][0]["port"] == 9465]
    assert len(probe_in) == len(probe_out) == 1
    for rule in (probe_in[0]["from"], probe_out[0]["to"]):
        assert rule == [{"podSelector": {"matchLabels": rule[0]["podSelector"]["matchLabels"]}}]
        assert rule[0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "reclaimd"
    deploy = only(docs, "Deployment")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "peer-probe", "containerPort": 9465, "protocol": "TCP"} in container["ports"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    config = yaml.safe_load(only(docs, "ConfigMap")["data"]["config.yaml"])
    assert config["peer_probe"]["port"] == 9465


def test_training_namespace_policy_admits_the_checkpoint_port_only_from_reclaimd(
    tmp_path: Path,
) -> None:
    values = {"networkPolicy": {"trainingNamespaces": ["team-a"], "checkpoint": {"port": 8080}}}
    docs = render(tmp_path, values)
    np = only(docs, "NetworkPolicy", "reclaimd-checkpoint-port")
    assert np["metadata"]["namespace"] == "team-a"
    from_reclaimd, everything_else = np["spec"]["ingress"]
    assert from_reclaimd["ports"] == [{"port": 8080, "protocol": "TCP"}]
    peer = from_reclaimd["from"][0]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "reclaimd"}
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "reclaimd"
    assert "from" not in everything_else
    tcp = [(p["port"], p["endPort"]) for p in everything_else["ports"] if p["protocol"] == "TCP"]
    assert tcp == [(1, 8079), (8081, 65535)]  # every TCP port but the checkpoint one


# --- monitoring ------------------------------------------------------------------------------


def test_monitors_and_dashboard_are_opt_in(tmp_path: Path) -> None:
    values = {
        "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
        "grafana": {"dashboard": {"enabled": True}},
    }
    docs = render(tmp_path, values)
    sm = only(docs, "ServiceMonitor")
    svc = only(docs, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    assert only(docs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    dash = only(docs, "ConfigMap", "reclaimd-dashboard")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((REPO / "deploy" / "grafana" / "reclaimd-dashboard.json").read_text())
    assert json.loads(dash["data"]["reclaimd-dashboard.json"]) == shipped


# --- the drill (a game day run by `helm test`) -----------------------------------------------

DRILL = {"drill": {"enabled": True, "nodeLabel": "reclaimd.io/gameday=allowed"}}


def drill_docs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["metadata"]["labels"].get("app.kubernetes.io/component") == "drill"
    ]


def test_the_drill_is_off_by_default(tmp_path: Path) -> None:
    docs = render(tmp_path)
    assert drill_docs(docs) == []
    assert not [d for d in docs if "helm.sh/hook" in d["metadata"].get("annotations", {})]


def test_the_drill_is_a_test_hook_running_a_game_day_against_the_release(tmp_path: Path) -> None:
    docs = render(tmp_path, DRILL, release="prod")
    job = only(docs, "Job")
    hook = job["metadata"]["annotations"]
    assert hook["helm.sh/hook"] == "test"  # `helm test prod`; upgrades never touch it
    assert hook["helm.sh/hook-delete-policy"] == "before-hook-creation"
    assert job["metadata"]["name"] == "prod-reclaimd-drill"
    assert job["metadata"]["namespace"] == "reclaimd"
    assert job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == "prod-reclaimd-drill"
    (c,) = pod["containers"]
    assert c["image"] == "ghcr.io/reclaimd/reclaimd-chaos:0.1.0"
    assert c["args"] == [
        "drill", "run", "/opt/reclaimd/scenarios/gameday-spot-storm.yaml", "--cluster",
        "--release", "prod", "--release-namespace", "reclaimd",
        "--node-label", "reclaimd.io/gameday=allowed", "--max-nodes", "6",
        "--namespace", "prod-reclaimd-drill",
    ]  # fmt: skip
    assert {"name": "HOME", "value": "/tmp"} in c["env"]  # uid 65532 has no home of its own
    # The controller's restricted profile, and its read-only root.
    deploy = only(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == deploy["securityContext"]
    assert c["securityContext"] == deploy["containers"][0]["securityContext"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/tmp"]
    # Off the nodes it drills, and off reclaimable ones.
    exprs = set(match_expressions(pod))
    assert ("reclaimd.io/gameday", "NotIn", ("allowed",)) in exprs
    assert ("karpenter.sh/capacity-type", "NotIn", ("spot",)) in exprs
    # The Job alone is a hook: its namespace, account and rights are the release's, there
    # before any `helm test` (each run deletes only its own objects in the probes' namespace).
    assert only(docs, "Namespace")["metadata"]["name"] == "prod-reclaimd-drill"
    assert only(docs, "Role", "prod-reclaimd-drill-probes")["metadata"]["namespace"] == (
        "prod-reclaimd-drill"
    )
    hooks = [d for d in docs if "helm.sh/hook" in d["metadata"].get("annotations", {})]
    assert hooks == [job]


def test_the_drill_args_follow_the_values(tmp_path: Path) -> None:
    values = {
        "drill": {
            **DRILL["drill"], "scenario": "/scenarios/mine.yaml", "maxNodes": 2,
            "namespace": "gameday", "createNamespace": False, "dryRun": True,
            "extraArgs": ["--json", "/tmp/v.json"],
            "image": {"repository": "localhost/reclaimd-chaos", "tag": "dev"},
        }
    }  # fmt: skip
    docs = render(tmp_path, values)
    assert not [d for d in docs if d["kind"] == "Namespace"]  # it is there already
    assert only(docs, "RoleBinding", "reclaimd-drill-probes")["metadata"]["namespace"] == "gameday"
    (c,) = only(docs, "Job")["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "localhost/reclaimd-chaos:dev"
    assert c["args"][2] == "/scenarios/mine.yaml"  # a path: as given
    assert c["args"][c["args"].index("--max-nodes") + 1] == "2"
    assert c["args"][c["args"].index("--namespace") + 1] == "gameday"
    assert c["args"][-3:] == ["--dry-run", "--json", "/tmp/v.json"]


def drill_rules(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {
        f"{d['kind']} {d['metadata'].get('namespace', '')}/{d['metadata']['name']}": d["rules"]
        for d in drill_docs(docs)
        if d["kind"] in ("Role", "ClusterRole")
    }


def test_the_drill_has_rights_of_its_own_and_nothing_on_secrets(tmp_path: Path) -> None:
    docs = render(tmp_path, DRILL)
    roles = drill_rules(docs)
    assert sorted(roles) == [
        "ClusterRole /reclaimd-drill",
        "Role default/reclaimd-drill-node-events",
        "Role reclaimd-drill/reclaimd-drill-probes",
        "Role reclaimd/reclaimd-drill",
    ]
    for rules in roles.values():
        assert not [r for r in rules if "secrets" in r["resources"]]
        assert not [r for r in rules if "*" in r["verbs"] or "*" in r["resources"]]
        assert not [r for r in rules if "*" in r["apiGroups"]]
        # ConfigMaps only by name: the release's settings.
        for r in rules:
            if "configmaps" in r["resources"]:
                assert r["resourceNames"], r
    cluster = roles["ClusterRole /reclaimd-drill"]
    assert cluster == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]  # no namespace right: the given one is neither made nor deleted by the drill
    own = roles["Role reclaimd/reclaimd-drill"]
    assert {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["reclaimd"],
            "verbs": ["get"]} in own  # fmt: skip
    (pods,) = [r for r in own if r["resources"] == ["pods"]]
    assert "delete" not in pods["verbs"]  # only with drill.faults
    # Bound to the drill's ServiceAccount alone; the controller's roles do not name it.
    for d in docs:
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            names = {s["name"] for s in d["subjects"]}
            drill = d in drill_docs(docs)
            assert names == ({"reclaimd-drill"} if drill else {"reclaimd"}), d["metadata"]


def test_the_drill_deletes_pods_of_the_release_only_with_faults(tmp_path: Path) -> None:
    values = {"drill": {**DRILL["drill"], "faults": True}, "nodeAgent": {"enabled": True}}
    own = drill_rules(render(tmp_path, values))["Role reclaimd/reclaimd-drill"]
    (pods,) = [r for r in own if r["resources"] == ["pods"]]
    assert pods["verbs"] == ["list", "watch", "delete"]
    (cms,) = [r for r in own if r["resources"] == ["configmaps"]]
    assert cms["resourceNames"] == ["reclaimd", "reclaimd-node-agent"]


def test_the_drill_pod_is_selected_by_none_of_the_controllers_selectors(tmp_path: Path) -> None:
    docs = render(tmp_path, {**DRILL, "controller": {"replicas": 2}})
    labels = only(docs, "Job")["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "drill"
    selectors = [
        only(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
        only(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        only(docs, "Service")["spec"]["selector"],
        only(docs, "Deployment")["spec"]["selector"]["matchLabels"],
    ]
    for selector in selectors:
        assert selector  # an empty selector would select every pod
        assert not selector.items() <= labels.items(), selector


def test_the_drill_refuses_the_release_namespace_and_needs_its_node_label(tmp_path: Path) -> None:
    with pytest.raises(HelmError, match=r"drill\.nodeLabel"):
        render(tmp_path, {"drill": {"enabled": True}})
    with pytest.raises(HelmError, match="must not be the release namespace"):
        render(tmp_path, {"drill": {**DRILL["drill"], "namespace": "reclaimd"}})


# --- the schema ------------------------------------------------------------------------------

BAD_VALUES = [
    pytest.param({"controller": {"replicas": 0}}, "at '/controller/replicas'", id="zero-replicas"),
    pytest.param({"controller": {"replica": 2}}, "at '/controller'", id="typo-in-a-key"),
    pytest.param({"nodeAgent": {"source": "oci"}}, "at '/nodeAgent/source'", id="unknown-source"),
    pytest.param(
        {"serviceAccount": {"awsRoleArn": "reclaimd-role"}},
        "at '/serviceAccount/awsRoleArn'",
        id="not-an-arn",
    ),
    pytest.param(
        {"serviceAccount": {"azureClientId": "reclaimd-identity"}},
        "at '/serviceAccount/azureClientId'",
        id="client-id-not-a-guid",
    ),
    pytest.param(
        {"networkPolicy": {"checkpoint": {"port": "8080"}}},
        "at '/networkPolicy/checkpoint/port'",
        id="port-as-string",
    ),
    pytest.param(
        {"networkPolicy": {"apiServer": {"cidrs": ["10.0.0.0"]}}},
        "at '/networkPolicy/apiServer/cidrs/0'",
        id="cidr-no-mask",
    ),
    pytest.param(
        {"secretEnv": {"TOKEN": {"secretName": "s"}}}, "at '/secretEnv/TOKEN'", id="ref-without-key"
    ),
    pytest.param(
        {"secretEnv": {"lower": {"secretName": "s", "key": "k"}}},
        "'lower' does not match pattern",
        id="bad-env",
    ),
    pytest.param({"logLevel": "verbose"}, "at '/logLevel'", id="unknown-log-level"),
    pytest.param(
        {"config": {"pubsub": {"slots": 0}}}, "at '/config/pubsub/slots'", id="no-pubsub-slot"
    ),
    pytest.param(
        {"controller": {"antiAffinity": "maybe"}}, "at '/controller/antiAffinity'", id="anti"
    ),
    pytest.param(
        {"reclaimable": {"nodeLabels": []}},
        "at '/reclaimable/nodeLabels'",
        id="no-reclaimable-labels",
    ),
    pytest.param(
        {"drill": {"nodeLabel": "reclaimd.io/gameday"}},
        "at '/drill/nodeLabel'",
        id="label-no-value",
    ),
    pytest.param({"drill": {"maxNodes": 0}}, "at '/drill/maxNodes'", id="drill-no-nodes"),
    pytest.param(
        {"drill": {"namespace": "kube-system"}}, "at '/drill/namespace'", id="drill-kube-system"
    ),
    pytest.param({"drill": {"scenario": "storm"}}, "at '/drill/scenario'", id="drill-not-yaml"),
]


@pytest.mark.parametrize(("values", "where"), BAD_VALUES)
def test_schema_refuses(tmp_path: Path, values: dict[str, Any], where: str) -> None:
    with pytest.raises(HelmError) as e:
        render(tmp_path, values)
    assert "values don't meet the specifications of the schema" in str(e.value)
    assert where in str(e.value)  # names the field (helm misplaces a propertyNames error)
