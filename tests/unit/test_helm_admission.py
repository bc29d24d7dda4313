"""The chart's `admission` values: one ValidatingAdmissionPolicy and binding per rule, the values
written into the CEL as literals, and what the schema refuses. What the API server does with
them (pods admitted, refused, warned) is tests/e2e/test_admission.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_helm_chart import HelmError, helm, only, render

__all__ = ["helm"]  # its fixture: a clear failure when helm is not built

RULES = ("cost-labels", "user-data-labels", "spot-checkpoint", "slo-inference-off-spot")


def _on(**admission: Any) -> dict[str, Any]:
    return {"admission": {"enabled": True, **admission}}


def _variables(policy: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"]}


def _policies(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"].removeprefix("reclaimd-"): d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy"
    }


def test_off_by_default(tmp_path: Path) -> None:
    kinds = {d["kind"] for d in render(tmp_path)}
    assert not kinds & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def test_one_policy_and_binding_per_rule_warn_by_default(tmp_path: Path) -> None:
    docs = render(tmp_path, _on())
    policies = _policies(docs)
    assert sorted(policies) == sorted(RULES)
    for rule, p in policies.items():
        assert p["apiVersion"] == "admissionregistration.k8s.io/v1"
        assert p["spec"]["failurePolicy"] == "Fail"
        (match,) = p["spec"]["matchConstraints"]["resourceRules"]
        assert match["resources"] == ["pods"] and match["operations"] == ["CREATE", "UPDATE"]
        (check,) = p["spec"]["validations"]
        assert check["expression"] and check["messageExpression"]
        binding = only(docs, "ValidatingAdmissionPolicyBinding", f"reclaimd-{rule}")
        assert binding["spec"]["policyName"] == f"reclaimd-{rule}"
        assert binding["spec"]["validationActions"] == ["Warn"]
        assert binding["spec"]["matchResources"]["namespaceSelector"] == {
            "matchLabels": {"reclaimd.io/admission": "true"}
        }


def test_deny_and_a_namespace_selector_of_ones_own(tmp_path: Path) -> None:
    selector = {"matchExpressions": [{"key": "team", "operator": "In", "values": ["ml"]}]}
    docs = render(
        tmp_path,
        {"admission": {"enabled": True, "action": "Deny", "namespaceSelector": selector}},
    )
    for rule in RULES:
        binding = only(docs, "ValidatingAdmissionPolicyBinding", f"reclaimd-{rule}")
        assert binding["spec"]["validationActions"] == ["Deny"]
        # The default matchLabels merge in unless set to null (helm merges maps).
        assert binding["spec"]["matchResources"]["namespaceSelector"] == {
            **selector,
            "matchLabels": {"reclaimd.io/admission": "true"},
        }


def test_the_defaults_are_what_reclaimd_reads(tmp_path: Path) -> None:
    """The cost labels are the pod label keys reclaimd/ledger/labels.py maps to tenant and
    queue; the spot labels are reclaimable.nodeLabels; the user-data keys are the ledger's
    refused ones."""
    from reclaimd.ledger import labels

    p = _policies(render(tmp_path, _on()))
    cost = _variables(p["cost-labels"])
    assert json.loads(cost["names"]) == ["tenant", "queue"]
    keys = json.loads(cost["keys"])
    assert keys == {
        "tenant": list(labels._POD_SOURCES["tenant"]),
        "queue": list(labels._POD_SOURCES["queue"]),
    }
    assert set(json.loads(_variables(p["user-data-labels"])["refused"])) == labels.ALWAYS_REFUSED
    spot = _variables(p["spot-checkpoint"])
    assert json.loads(spot["reclaimable"])["karpenter.sh/capacity-type"] == ["spot"]
    assert json.loads(spot["reclaimable"])["cloud.google.com/gke-spot"] == ["true"]
    assert '"reclaimd.io/checkpoint-url"' in spot["optedIn"]
    assert _variables(p["slo-inference-off-spot"])["spot"] == spot["spot"]


def test_values_become_the_cels_literals(tmp_path: Path) -> None:
    values = {
        "reclaimable": {
            "nodeLabels": [
                {"key": "pool.example.com/kind", "values": ["spot", "lent"]},
                {"key": "pool.example.com/kind", "values": ["borrowed"]},
            ]
        },
        **_on(
            gpuResources=["example.com/accelerator"],
            costLabels={
                "enabled": True,
                "required": [
                    {"name": "tenant", "keys": ["team.example.com/tenant"]},
                    {"name": "cell", "keys": ["reclaimd.io/cell"]},
                ],
            },
            requireCheckpointAnnotationForSpot={"enabled": True, "annotation": "ex.io/ckpt"},
            sloInference={"enabled": True, "label": "tier", "values": ["gold", "silver"]},
        ),
    }
    p = _policies(render(tmp_path, values))
    cost = _variables(p["cost-labels"])
    assert json.loads(cost["gpuResources"]) == ["example.com/accelerator"]
    assert json.loads(cost["names"]) == ["tenant", "cell"]
    assert json.loads(cost["keys"])["cell"] == ["reclaimd.io/cell"]
    spot = _variables(p["spot-checkpoint"])
    assert json.loads(spot["reclaimable"]) == {
        "pool.example.com/kind": ["spot", "lent", "borrowed"]
    }
    assert json.loads(spot["reclaimableKeys"]) == ["pool.example.com/kind"]
    assert '"ex.io/ckpt" in object.metadata.annotations' in spot["optedIn"]
    assert (
        "set the annotation ex.io/ckpt"
        in p["spot-checkpoint"]["spec"]["validations"][0]["messageExpression"]
    )
    slo = _variables(p["slo-inference-off-spot"])
    assert json.loads(slo["sloValues"]) == ["gold", "silver"]
    assert (
        slo["isSlo"]
        == '"tier" in variables.labels && variables.labels["tier"] in variables.sloValues'
    )
    assert (
        "(label tier=gold|silver)"
        in p["slo-inference-off-spot"]["spec"]["validations"][0]["messageExpression"]
    )


@pytest.mark.parametrize("rule", RULES)
def test_a_rule_turned_off_renders_neither_policy_nor_binding(tmp_path: Path, rule: str) -> None:
    key = {
        "cost-labels": "costLabels",
        "user-data-labels": "userDataLabels",
        "spot-checkpoint": "requireCheckpointAnnotationForSpot",
        "slo-inference-off-spot": "sloInference",
    }[rule]
    docs = render(tmp_path, _on(**{key: {"enabled": False}}))
    assert sorted(_policies(docs)) == sorted(r for r in RULES if r != rule)
    names = {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert f"reclaimd-{rule}" not in names and len(names) == 3


@pytest.mark.parametrize(
    "admission",
    [
        {"action": "Audit"},  # Warn or Deny
        {"gpuResources": ['nvidia.com/gpu"] + ["x']},  # nothing that could leave a CEL string
        {"costLabels": {"enabled": True, "required": [{"name": "sku", "keys": ["sku"]}]}},
        {"costLabels": {"enabled": True, "required": [{"name": "tenant", "keys": []}]}},
        {"userDataLabels": {"enabled": True, "keys": ["Prompt"]}},  # matched lower-cased
        {"requireCheckpointAnnotationForSpot": {"enabled": True, "annotation": "a'b"}},
        {"sloInference": {"enabled": True, "label": "tier", "values": []}},
        {"namespaceSelector": {"matchNames": ["x"]}},
    ],
)
def test_the_schema_refuses(tmp_path: Path, admission: dict[str, Any]) -> None:
    with pytest.raises(HelmError, match="admission"):
        render(tmp_path, _on(**admission))
