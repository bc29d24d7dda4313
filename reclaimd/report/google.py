"""How a Google Cloud bill's rows become relation ``focus``: the columns Google's FOCUS export
(BigQuery ``gcp_billing_export_focus_*``) has and the ones it lacks.

Confirmed against Google's schema page, its FOCUS view over the detailed export and a live
export's columns (docs/ledger.md, "Google Cloud's FOCUS export"): no SkuMeter (the SKU's
description, ``sku.description``, is ChargeDescription), no ServiceCategory (ServiceName is
the service, "Compute Engine" for a VM's GPU, core and RAM SKUs), an instance's ResourceId
``//compute.googleapis.com/projects/<project number>/zones/<zone>/instances/<numeric id>``
with its name in ResourceName and its project id in SubAccountId. Each function returns SQL
valid in DuckDB and Trino over text expressions the caller gives.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

from reclaimd.report.ledger_input import InputError

# Where a row names its SKU ("Nvidia H100 80GB GPU running in Americas"), first found first.
SKU_NAMES: Final = ("SkuMeter", "x_SkuDescription", "ChargeDescription")
COMPUTE_SERVICE: Final = "Compute Engine"  # service.description of a VM's SKUs
# Columns of the detailed usage cost export (gcp_billing_export_resource_v1_*): not FOCUS.
DETAILED_COLUMNS: Final = ("usage_start_time", "cost_type", "sku")


def is_google(provider: str) -> str:
    return f"LOWER({provider}) LIKE 'google%'"


def instance_id(provider: str, sub_account: str, resource_name: str) -> str:
    """A bill row's instance id from ``focus_ids``'s ``m.name, m.project, m.is_instance``:
    a Google row's 'project/name' as the meter names it (``gce://project/zone/name``).

    An instance's name is its ResourceName (the ResourceId ends in its numeric id), else the
    ResourceId's last segment (a short 'gpu-1', or a path of names); only an instance's
    ResourceName counts, as its boot disk's is the same name. The project is SubAccountId
    (the project id; the ResourceId may hold the project's number), else the ResourceId's.
    """
    sub = f"NULLIF({sub_account}, '')"
    own = f"NULLIF({resource_name}, '')"
    name = f"COALESCE(CASE WHEN m.is_instance = 1 THEN {own} END, m.name)"
    return (
        f"CASE WHEN {is_google(provider)}"
        f" THEN COALESCE(COALESCE({sub}, m.project) || '/' || {name}, {name}) ELSE m.name END"
    )


def service_category(provider: str, stated: str | None, service_name: str | None) -> str:
    """ServiceCategory (``stated``, None if the bill has no such column); a Google row
    without one is 'Compute' when its ServiceName is Compute Engine."""
    if service_name is None:
        return stated or "CAST(NULL AS VARCHAR)"
    derived = (
        f"CASE WHEN {is_google(provider)} AND {service_name} = '{COMPUTE_SERVICE}'"
        " THEN 'Compute' END"
    )
    return f"COALESCE({stated}, {derived})" if stated else derived


def sku_name(named: list[str]) -> str:
    """The first SKU name a row has ('' is none: Parquet keeps it, a CSV's is NULL)."""
    if not named:
        return "CAST(NULL AS VARCHAR)"
    firsts = [f"NULLIF({n}, '')" for n in named]
    # Trino's COALESCE takes two arguments at least
    return firsts[0] if len(firsts) == 1 else f"COALESCE({', '.join(firsts)})"


def refuse_detailed_export(path: Path, kinds: Mapping[str, str]) -> None:
    """The detailed export's nested columns (sku.description, usage.amount in seconds and
    byte-seconds, resource.global_name) are not FOCUS; say what to give instead."""
    if all(c in kinds for c in DETAILED_COLUMNS):
        raise InputError(
            f"{path}: this is Google Cloud's detailed usage cost export"
            " (gcp_billing_export_resource_v1_*), not FOCUS: give the FOCUS export"
            ' (gcp_billing_export_focus_*, Cloud Billing\'s "FOCUS usage cost data") instead'
        )
