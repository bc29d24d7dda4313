"""The chart's admission rules (templates/admission.yaml) on the real API server (1.35): each
ValidatingAdmissionPolicy as the chart renders it, bound with Deny in one namespace and with
Warn in another, and pods that must be admitted, refused or warned, with the words a user
sees: kubectl's ``Error from server (Forbidden)`` line under Deny, its ``Warning:`` lines (the
API server's warning headers) under Warn.

Pods are created for real (kwok schedules nothing that asks for a GPU: they stay Pending), so
an UPDATE can be tried on a pod the API server admitted. docs/admission.md lists the rules.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from stack import Stack
from test_helm_install import CHART, HELM, KUBE_VERSION

RUN = "a" + uuid.uuid4().hex[:5]
RUN_LABEL = "reclaimd.io/e2e-admission"
DEFAULT_LABEL = {"reclaimd.io/admission": "true"}  # the chart's default namespaceSelector
NS = {"Deny": f"rd-adm-deny-{RUN}", "Warn": f"rd-adm-warn-{RUN}"}
OUTSIDE = f"rd-adm-off-{RUN}"  # carries no selected label: no rule applies
RELEASE = {"Deny": f"adm-deny-{RUN}", "Warn": f"adm-warn-{RUN}"}
CHECKPOINT_URL = {"reclaimd.io/checkpoint-url": "http://{pod_ip}:8080/checkpoint"}
COST = {"reclaimd.io/tenant": "team-a", "reclaimd.io/queue": "train"}
SLO = {"reclaimd.io/workload-class": "slo-inference"}
GPU = {"limits": {"nvidia.com/gpu": "1"}}
SPOT_SELECTOR = {"karpenter.sh/capacity-type": "spot"}
GKE_SPOT_TOLERATION = {"key": "cloud.google.com/gke-spot", "operator": "Exists"}
AKS_SPOT_TOLERATION = {
    "key": "kubernetes.azure.com/scalesetpriority",
    "operator": "Equal",
    "value": "spot",
    "effect": "NoSchedule",
}


def policy(action: str, rule: str) -> str:
    return f"{RELEASE[action]}-reclaimd-{rule}"


# What the API server says, per rule, for the pods below (the chart's default values).
MISSING_BOTH = (
    "a GPU pod must carry the cost labels reclaimd meters and charges GPU time by; missing: "
    "tenant (label reclaimd.io/tenant), queue (label reclaimd.io/queue or "
    "kueue.x-k8s.io/queue-name)"
)
MISSING_TENANT = (
    "a GPU pod must carry the cost labels reclaimd meters and charges GPU time by; missing: "
    "tenant (label reclaimd.io/tenant)"
)


def user_data(key: str) -> str:
    return (
        f"label key {key} is user data: prompt, user_email, session_raw are never label keys "
        "(labels are indexed, logged and exported with costs); move it out of the labels"
    )


def spot_checkpoint(keys: str) -> str:
    return (
        f"a GPU pod placed on spot capacity (it selects, prefers or tolerates {keys}) must opt "
        "into checkpointing: set the annotation reclaimd.io/checkpoint-url "
        "(docs/checkpoint-contract.md)"
    )


def slo_on_spot(keys: str) -> str:
    return (
        "an SLO inference pod (label reclaimd.io/workload-class=slo-inference) must never land "
        f"on spot capacity, and this one selects, prefers or tolerates {keys}: remove that "
        "nodeSelector, node affinity or toleration"
    )


def denied(action: str, rule: str, message: str, name: str) -> str:
    return (
        f"pods \"{name}\" is forbidden: ValidatingAdmissionPolicy '{policy(action, rule)}' "
        f"with binding '{policy(action, rule)}' denied request: {message}"
    )


def warned(rule: str, message: str) -> str:
    name = policy("Warn", rule)
    return (
        f"Warning: Validation failed for ValidatingAdmissionPolicy '{name}' "
        f"with binding '{name}': {message}"
    )


def pod(
    name: str,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    resources: dict[str, Any] | None = None,
    init_gpu: bool = False,
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/trainer:1"}
    if resources is not None:
        container["resources"] = resources
    body: dict[str, Any] = {"containers": [container], **spec}
    # Never scheduled: admission is what is tested, and a GPU pod asking for spot would
    # otherwise land on another test's kwok node and join its gangs.
    body.setdefault("schedulingGates", [{"name": "reclaimd.io/admission-test"}])
    if init_gpu:
        body["initContainers"] = [
            {"name": "warm", "image": "registry.invalid/trainer:1", "resources": GPU}
        ]
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


@dataclass(frozen=True)
class Answer:
    ok: bool
    out: str
    err: str

    @property
    def warnings(self) -> list[str]:
        return [ln for ln in self.err.splitlines() if ln.startswith("Warning: ")]

    @property
    def forbidden(self) -> str:
        assert not self.ok, f"admitted: {self.out}"
        prefix = "Error from server (Forbidden): "
        lines = [ln for ln in self.err.splitlines() if ln.startswith(prefix)]
        assert len(lines) == 1, self.err
        # kubectl create -f - names the input: 'error when creating "STDIN": ' before it.
        return lines[0].removeprefix(prefix).split('"STDIN": ', 1)[-1]


def kubectl(stack: Stack, *args: str, stdin: str | None = None) -> Answer:
    done = subprocess.run(
        ["kubectl", f"--kubeconfig={stack.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return Answer(done.returncode == 0, done.stdout, done.stderr)


def must(answer: Answer) -> Answer:
    assert answer.ok, answer.err
    return answer


def create(stack: Stack, ns: str, manifest: dict[str, Any]) -> Answer:
    return kubectl(stack, "create", "-n", ns, "-f", "-", stdin=json.dumps(manifest))


def patch(stack: Stack, ns: str, name: str, change: dict[str, Any]) -> Answer:
    return kubectl(stack, "patch", "-n", ns, "pod", name, "--type=merge", "-p", json.dumps(change))


def render(action: str) -> str:
    values = {
        "config": {"cluster_name": "e2e"},  # required by the chart
        "admission": {
            "enabled": True,
            "action": action,
            # Merged with the default matchLabels: a namespace needs both.
            "namespaceSelector": {"matchLabels": {RUN_LABEL: f"{RUN}-{action.lower()}"}},
        }
    }
    done = subprocess.run(
        [
            str(HELM),
            "template",
            RELEASE[action],
            str(CHART),
            "--namespace",
            "reclaimd",
            "--kube-version",
            KUBE_VERSION,
            "--show-only",
            "templates/admission.yaml",
            "-f",
            "-",
        ],
        input=yaml.safe_dump(values),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _wait_in_force(stack: Stack, action: str) -> None:
    """Until the API server's policy cache has the four bindings: a probe that breaks every
    rule is refused (Deny) or draws four warnings (Warn). A dry run: nothing is created."""
    probe = pod(
        f"probe-{uuid.uuid4().hex[:6]}",
        labels={"prompt": "x", **SLO},
        resources=GPU,
        nodeSelector=SPOT_SELECTOR,
    )
    deadline = time.monotonic() + 60
    while True:
        got = kubectl(
            stack,
            "create",
            "--dry-run=server",
            "-n",
            NS[action],
            "-f",
            "-",
            stdin=json.dumps(probe),
        )
        if (action == "Deny" and not got.ok) or (action == "Warn" and len(got.warnings) == 4):
            return
        assert time.monotonic() < deadline, f"{action} policies not in force after 60 s: {got}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(stack: Stack) -> Iterator[Stack]:
    if not HELM.is_file():
        pytest.fail(f"no helm at {HELM}: run deploy/helm/tools.sh", pytrace=False)
    for action, ns in NS.items():
        labels = {**DEFAULT_LABEL, RUN_LABEL: f"{RUN}-{action.lower()}"}
        namespace = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": labels},
        }
        must(kubectl(stack, "apply", "-f", "-", stdin=json.dumps(namespace)))
    # Selected by neither binding's label (it has the default label alone).
    outside = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": OUTSIDE, "labels": DEFAULT_LABEL},
    }
    must(kubectl(stack, "apply", "-f", "-", stdin=json.dumps(outside)))
    for ns in (*NS.values(), OUTSIDE):
        # Pod admission needs the default ServiceAccount, which the controller-manager makes
        # when it gets to it.
        account = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": ns},
        }
        kubectl(stack, "apply", "-f", "-", stdin=json.dumps(account))
    try:
        for action in NS:
            must(kubectl(stack, "apply", "--validate=strict", "-f", "-", stdin=render(action)))
        for action in NS:
            _wait_in_force(stack, action)
        yield stack
    finally:
        for action in NS:
            kubectl(
                stack,
                "delete",
                "validatingadmissionpolicybindings,validatingadmissionpolicies",
                "-l",
                f"app.kubernetes.io/instance={RELEASE[action]}",
                "--ignore-not-found",
            )
        kubectl(
            stack,
            "delete",
            "namespace",
            *NS.values(),
            OUTSIDE,
            "--wait=false",
            "--ignore-not-found",
        )


def name() -> str:
    return f"p-{uuid.uuid4().hex[:8]}"


# --- what is admitted without a word -------------------------------------------------------

ADMITTED: dict[str, dict[str, Any]] = {
    "gpu pod with reclaimd's labels": dict(labels=COST, resources=GPU),
    "queue from Kueue's label": dict(
        labels={"reclaimd.io/tenant": "team-a", "kueue.x-k8s.io/queue-name": "train"},
        resources=GPU,
    ),
    "cpu pod without labels": dict(resources={"limits": {"cpu": "1"}}),
    "label keys that only contain a refused word": dict(
        labels={**COST, "prompt-version": "3", "user_email_hash": "x"}, resources=GPU
    ),
    "spot gpu pod that opts into checkpointing": dict(
        labels=COST, annotations=CHECKPOINT_URL, resources=GPU, nodeSelector=SPOT_SELECTOR
    ),
    "gpu pod pinned to on-demand": dict(
        labels=COST, resources=GPU, nodeSelector={"karpenter.sh/capacity-type": "on-demand"}
    ),
    "cpu pod on spot without checkpointing": dict(
        resources={"limits": {"cpu": "1"}}, tolerations=[GKE_SPOT_TOLERATION]
    ),
    "slo inference off spot": dict(
        labels={**COST, **SLO},
        resources=GPU,
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "karpenter.sh/capacity-type",
                                    "operator": "NotIn",
                                    "values": ["spot"],
                                }
                            ]
                        }
                    ]
                }
            }
        },
    ),
}


@pytest.mark.parametrize("action", sorted(NS))
@pytest.mark.parametrize("case", sorted(ADMITTED))
def test_compliant_pods_are_admitted_without_warnings(
    cluster: Stack, action: str, case: str
) -> None:
    got = must(create(cluster, NS[action], pod(name(), **ADMITTED[case])))
    assert got.warnings == []


# --- what is refused (Deny) or warned (Warn), with the message ------------------------------

REFUSED: dict[str, tuple[dict[str, Any], str, str]] = {
    "gpu pod without cost labels": (dict(resources=GPU), "cost-labels", MISSING_BOTH),
    "empty tenant": (
        dict(labels={**COST, "reclaimd.io/tenant": ""}, resources=GPU),
        "cost-labels",
        MISSING_TENANT,
    ),
    "gpu asked by an init container": (
        dict(labels={"reclaimd.io/queue": "train"}, init_gpu=True),
        "cost-labels",
        MISSING_TENANT,
    ),
    "a MIG slice is a gpu": (
        dict(
            labels={"reclaimd.io/queue": "train"},
            resources={"limits": {"nvidia.com/mig-1g.10gb": "1"}},
        ),
        "cost-labels",
        MISSING_TENANT,
    ),
    "prompt label on a cpu pod": (
        dict(labels={"prompt": "hello"}),
        "user-data-labels",
        user_data("prompt"),
    ),
    "user_email label": (
        dict(labels={**COST, "user_email": "a.example.com"}, resources=GPU),
        "user-data-labels",
        user_data("user_email"),
    ),
    "session_raw behind a prefix, in capitals": (
        dict(labels={"example.com/Session_Raw": "x"}),
        "user-data-labels",
        user_data("example.com/Session_Raw"),
    ),
    "spot by nodeSelector": (
        dict(labels=COST, resources=GPU, nodeSelector=SPOT_SELECTOR),
        "spot-checkpoint",
        spot_checkpoint("karpenter.sh/capacity-type"),
    ),
    "spot by required affinity": (
        dict(
            labels=COST,
            resources=GPU,
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "cloud.google.com/gke-spot",
                                        "operator": "In",
                                        "values": ["true"],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
        ),
        "spot-checkpoint",
        spot_checkpoint("cloud.google.com/gke-spot"),
    ),
    "spot by toleration, empty annotation": (
        dict(
            labels=COST,
            resources=GPU,
            tolerations=[AKS_SPOT_TOLERATION],
            annotations={"reclaimd.io/checkpoint-url": ""},
        ),
        "spot-checkpoint",
        spot_checkpoint("kubernetes.azure.com/scalesetpriority"),
    ),
    "slo inference tolerating spot": (
        dict(
            labels={**COST, **SLO},
            resources=GPU,
            annotations=CHECKPOINT_URL,
            tolerations=[GKE_SPOT_TOLERATION],
        ),
        "slo-inference-off-spot",
        slo_on_spot("cloud.google.com/gke-spot"),
    ),
    "slo inference preferring reclaimable nodes": (
        dict(
            labels={**COST, **SLO},
            resources=GPU,
            annotations=CHECKPOINT_URL,
            affinity={
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 10,
                            "preference": {
                                "matchExpressions": [
                                    {"key": "reclaimd.io/reclaimable", "operator": "Exists"}
                                ]
                            },
                        }
                    ]
                }
            },
        ),
        "slo-inference-off-spot",
        slo_on_spot("reclaimd.io/reclaimable"),
    ),
    "slo inference cpu pod tolerating every taint": (
        dict(labels=SLO, tolerations=[{"operator": "Exists"}]),
        "slo-inference-off-spot",
        slo_on_spot(
            "karpenter.sh/capacity-type, eks.amazonaws.com/capacityType, "
            "cloud.google.com/gke-spot, cloud.google.com/gke-preemptible, "
            "kubernetes.azure.com/scalesetpriority, reclaimd.io/reclaimable"
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_deny_refuses_with_the_rules_message(cluster: Stack, case: str) -> None:
    spec, rule, message = REFUSED[case]
    pod_name = name()
    got = create(cluster, NS["Deny"], pod(pod_name, **spec))
    assert got.forbidden == denied("Deny", rule, message, pod_name)
    assert not kubectl(cluster, "get", "-n", NS["Deny"], "pod", pod_name).ok


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_warn_admits_with_the_rules_message(cluster: Stack, case: str) -> None:
    spec, rule, message = REFUSED[case]
    pod_name = name()
    got = must(create(cluster, NS["Warn"], pod(pod_name, **spec)))
    assert got.warnings == [warned(rule, message)]
    must(kubectl(cluster, "get", "-n", NS["Warn"], "pod", pod_name))


def test_warn_names_every_rule_a_pod_breaks(cluster: Stack) -> None:
    got = must(
        create(
            cluster,
            NS["Warn"],
            pod(
                name(),
                labels={"user_email": "x", **SLO},
                resources=GPU,
                nodeSelector=SPOT_SELECTOR,
            ),
        )
    )
    assert sorted(got.warnings) == sorted(
        [
            warned("cost-labels", MISSING_BOTH),
            warned("user-data-labels", user_data("user_email")),
            warned("spot-checkpoint", spot_checkpoint("karpenter.sh/capacity-type")),
            warned("slo-inference-off-spot", slo_on_spot("karpenter.sh/capacity-type")),
        ]
    )


def test_namespaces_the_selector_does_not_match_are_not_checked(cluster: Stack) -> None:
    got = must(
        create(
            cluster,
            OUTSIDE,
            pod(
                name(),
                labels={"prompt": "x", **SLO},
                resources=GPU,
                nodeSelector=SPOT_SELECTOR,
            ),
        )
    )
    assert got.warnings == []


# --- updates: refused when they break a rule, not for what was already broken ---------------


def test_an_update_may_not_take_a_cost_label_away(cluster: Stack) -> None:
    ns, pod_name = NS["Deny"], name()
    must(create(cluster, ns, pod(pod_name, labels=COST, resources=GPU)))
    got = patch(cluster, ns, pod_name, {"metadata": {"labels": {"reclaimd.io/tenant": None}}})
    assert got.forbidden == denied("Deny", "cost-labels", MISSING_TENANT, pod_name)
    must(patch(cluster, ns, pod_name, {"metadata": {"annotations": {"note": "fine"}}}))


def test_an_update_may_not_add_a_user_data_label(cluster: Stack) -> None:
    ns, pod_name = NS["Deny"], name()
    must(create(cluster, ns, pod(pod_name, labels=COST, resources=GPU)))
    got = patch(cluster, ns, pod_name, {"metadata": {"labels": {"session_raw": "x"}}})
    assert got.forbidden == denied("Deny", "user-data-labels", user_data("session_raw"), pod_name)


def test_a_spot_pod_may_not_drop_its_checkpoint_annotation(cluster: Stack) -> None:
    ns, pod_name = NS["Deny"], name()
    spec = dict(labels=COST, annotations=CHECKPOINT_URL, resources=GPU, nodeSelector=SPOT_SELECTOR)
    must(create(cluster, ns, pod(pod_name, **spec)))
    got = patch(
        cluster, ns, pod_name, {"metadata": {"annotations": {"reclaimd.io/checkpoint-url": None}}}
    )
    message = spot_checkpoint("karpenter.sh/capacity-type")
    assert got.forbidden == denied("Deny", "spot-checkpoint", message, pod_name)


def test_a_gated_slo_pod_may_not_be_sent_to_spot(cluster: Stack) -> None:
    """A scheduling-gated pod's nodeSelector may still be set (Kueue does it when it admits a
    workload onto a flavor): putting an SLO inference pod on spot that way is refused too."""
    ns, pod_name = NS["Deny"], name()
    gated = pod(
        pod_name,
        labels={**COST, **SLO},
        annotations=CHECKPOINT_URL,
        resources=GPU,
        schedulingGates=[{"name": "reclaimd.io/e2e"}],
    )
    must(create(cluster, ns, gated))
    got = patch(cluster, ns, pod_name, {"spec": {"nodeSelector": SPOT_SELECTOR}})
    message = slo_on_spot("karpenter.sh/capacity-type")
    assert got.forbidden == denied("Deny", "slo-inference-off-spot", message, pod_name)
    on_demand = {"spec": {"nodeSelector": {"karpenter.sh/capacity-type": "on-demand"}}}
    must(patch(cluster, ns, pod_name, on_demand))


def test_a_pod_admitted_under_warn_can_still_be_updated(cluster: Stack) -> None:
    """The rules judge what an update changes: a pod that broke them before (admitted under
    Warn, or made before the policy) takes an annotation patch, as reclaimd's own
    last-checkpoint write, without a new warning."""
    ns, pod_name = NS["Warn"], name()
    must(
        create(
            cluster,
            ns,
            pod(pod_name, labels={"prompt": "x"}, resources=GPU, nodeSelector=SPOT_SELECTOR),
        )
    )
    got = must(
        patch(
            cluster,
            ns,
            pod_name,
            {"metadata": {"annotations": {"reclaimd.io/last-checkpoint": "2026-12-06T07:00:00Z"}}},
        )
    )
    assert got.warnings == []


def test_a_job_whose_pods_are_refused_says_why_in_its_events(cluster: Stack) -> None:
    """Pods a controller makes are refused at the controller: under Deny the user reads the
    message in the Job's FailedCreate event (kubectl describe job), and no pod exists."""
    ns, job = NS["Deny"], f"job-{uuid.uuid4().hex[:6]}"
    template = pod("unused", resources=GPU, restartPolicy="Never")
    del template["metadata"]["name"]
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job},
        "spec": {"backoffLimit": 0, "template": {k: template[k] for k in ("metadata", "spec")}},
    }
    must(kubectl(cluster, "create", "-n", ns, "-f", "-", stdin=json.dumps(manifest)))
    selector = f"reason=FailedCreate,involvedObject.kind=Job,involvedObject.name={job}"
    deadline = time.monotonic() + 90
    while True:
        got = must(kubectl(cluster, "get", "events", "-n", ns, "--field-selector", selector,
                           "-o", "json"))  # fmt: skip
        messages = [e["message"] for e in json.loads(got.out)["items"]]
        if messages:
            break
        assert time.monotonic() < deadline, f"no FailedCreate event for job {job} in 90 s"
        time.sleep(0.5)
    # The Job names its pods <job>-<5 random characters>.
    pattern = re.compile(
        rf'Error creating: pods "{job}-[a-z0-9]{{5}}" is forbidden: '
        + re.escape(denied("Deny", "cost-labels", MISSING_BOTH, "@").split("forbidden: ", 1)[1])
    )
    assert all(pattern.fullmatch(m) for m in messages), messages
    pods = must(kubectl(cluster, "get", "pods", "-n", ns, "-l", f"job-name={job}", "-o", "name"))
    assert pods.out.strip() == ""


def test_deny_refuses_with_one_rules_message_at_a_time(cluster: Stack) -> None:
    pod_name = name()
    got = create(cluster, NS["Deny"], pod(
        pod_name, labels={"user_email": "x", **SLO}, resources=GPU, nodeSelector=SPOT_SELECTOR,
    ))  # fmt: skip
    assert got.forbidden in {
        denied("Deny", "cost-labels", MISSING_BOTH, pod_name),
        denied("Deny", "user-data-labels", user_data("user_email"), pod_name),
        denied("Deny", "spot-checkpoint", spot_checkpoint("karpenter.sh/capacity-type"), pod_name),
        denied(
            "Deny", "slo-inference-off-spot", slo_on_spot("karpenter.sh/capacity-type"), pod_name
        ),
    }
