"""The chart's ``reclaimd-viewer`` rights for ``reclaimd status``: get/list of what it reads and
nothing else, Leases in the release namespace only, bound to ``viewer.subjects``. That
``status`` works with exactly these rights, against the real authorizer: e2e/test_status_e2e.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_helm_chart import HelmError, only, render

ONCALL = {"kind": "Group", "name": "oncall", "apiGroup": "rbac.authorization.k8s.io"}


def viewer_docs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["metadata"]["name"].endswith("-viewer")]


def test_the_viewer_is_opt_in(tmp_path: Path) -> None:
    assert viewer_docs(render(tmp_path)) == []


def test_the_viewer_may_get_and_list_what_status_reads_and_nothing_else(tmp_path: Path) -> None:
    docs = viewer_docs(render(tmp_path, {"viewer": {"create": True}}))
    assert sorted(d["kind"] for d in docs) == ["ClusterRole", "Role"]  # no subjects: no binding
    cluster = only(docs, "ClusterRole", "reclaimd-viewer")
    assert cluster["rules"] == [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list"]},
    ]
    role = only(docs, "Role", "reclaimd-viewer")
    assert role["metadata"]["namespace"] == "reclaimd"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list"]}
    ]


def test_the_viewer_is_bound_to_its_subjects(tmp_path: Path) -> None:
    docs = viewer_docs(
        render(tmp_path, {"viewer": {"create": True, "subjects": [ONCALL]}}, release="prod")
    )
    for kind, role in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = only(docs, kind, "prod-reclaimd-viewer")
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role,
            "name": "prod-reclaimd-viewer",
        }
        assert binding["subjects"] == [ONCALL]


@pytest.mark.parametrize(
    "viewer",
    [{"create": "yes"}, {"subjects": [{"kind": "Robot", "name": "x"}]}, {"bind": True}],
)
def test_the_schema_refuses_a_bad_viewer(tmp_path: Path, viewer: dict[str, Any]) -> None:
    with pytest.raises(HelmError, match="viewer"):
        render(tmp_path, {"viewer": viewer})
