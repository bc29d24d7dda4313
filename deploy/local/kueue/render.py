"""Render Kueue's webhook registrations for the local stack, pointed at loopback.

Kueue's release manifests register its webhooks through a Service (``webhook-service`` in
``kueue-system``); the local stack has no Services that route anywhere, so every
``clientConfig.service`` becomes ``clientConfig.url: https://127.0.0.1:<port><path>`` with the
stack's own Kueue CA as ``caBundle``. Sources are the files install.sh copied from the pinned
Kueue module (``config/components/webhook/manifests.yaml``, and the CRD conversion patches
that ``config/components/crd/kustomization.yaml`` applies), so a version bump follows upstream.

Only the webhooks of what the local Kueue runs are registered: Kueue's own types and
``batch/job``. Kueue serves no-op webhooks for the integrations it does not run, but
registering them (pods, deployments, statefulsets) would put every pod create in the shared
stack behind Kueue for nothing.

Writes JSON documents (valid apply-patch YAML) into OUT: ``crd-<name>.json`` (the conversion
stanza only, applied server-side next to the CRD bases) and ``<kind>.json`` for the two
webhook configurations. Errors are one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path
from typing import Any

import yaml

NAME_PREFIX = "kueue-"  # kustomize's namePrefix in Kueue's default install
KEEP_PATHS = (
    "/mutate-kueue-x-k8s-io-",
    "/validate-kueue-x-k8s-io-",
    "/mutate-batch-v1-job",
    "/validate-batch-v1-job",
)


def _url(base: str, service: dict[str, Any]) -> str:
    return base.rstrip("/") + str(service.get("path") or "/")


def webhook_configurations(manifests: Path, base_url: str, ca_bundle: str) -> list[dict[str, Any]]:
    out = []
    for doc in yaml.safe_load_all(manifests.read_text()):
        if not doc:
            continue
        kept = []
        for hook in doc.get("webhooks") or ():
            service = (hook.get("clientConfig") or {}).get("service") or {}
            if not str(service.get("path") or "").startswith(KEEP_PATHS):
                continue
            hook["clientConfig"] = {"url": _url(base_url, service), "caBundle": ca_bundle}
            kept.append(hook)
        if not kept:
            raise ValueError(f"{manifests}: no {doc.get('kind')} webhook for Kueue or batch/job")
        out.append(
            {
                "apiVersion": doc["apiVersion"],
                "kind": doc["kind"],
                "metadata": {"name": NAME_PREFIX + doc["metadata"]["name"]},
                "webhooks": kept,
            }
        )
    return out


def conversion_patch_files(manifests: Path) -> list[Path]:
    """The conversion patches Kueue's CRD kustomization applies (not every file beside it)."""
    kustomization = yaml.safe_load((manifests / "crd-kustomization.yaml").read_text())
    files = [
        manifests / str(p["path"])
        for p in kustomization.get("patches") or ()
        if str(p.get("path", "")).startswith("patches/webhook_in_")
    ]
    if not files:
        raise ValueError(f"{manifests}: the CRD kustomization names no conversion patch")
    return files


def conversion_patches(patches: list[Path], base_url: str, ca_bundle: str) -> list[dict[str, Any]]:
    out = []
    for path in patches:
        doc = yaml.safe_load(path.read_text())
        conversion = doc["spec"]["conversion"]
        service = conversion["webhook"]["clientConfig"]["service"]
        conversion["webhook"]["clientConfig"] = {
            "url": _url(base_url, service),
            "caBundle": ca_bundle,
        }
        out.append(
            {
                "apiVersion": doc["apiVersion"],
                "kind": doc["kind"],
                "metadata": {"name": doc["metadata"]["name"]},
                "spec": {"conversion": conversion},
            }
        )
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--manifests", type=Path, required=True, help="dir install.sh filled")
    p.add_argument("--ca", type=Path, required=True, help="PEM of the CA that signed the cert")
    p.add_argument("--url", required=True, help="https://127.0.0.1:<webhook port>")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        ca_bundle = base64.b64encode(args.ca.read_bytes()).decode()
        hooks = webhook_configurations(args.manifests / "webhooks.yaml", args.url, ca_bundle)
        crds = conversion_patches(conversion_patch_files(args.manifests), args.url, ca_bundle)
        args.out.mkdir(parents=True, exist_ok=True)
        for doc in hooks:
            (args.out / f"{doc['kind'].lower()}.json").write_text(json.dumps(doc))
        for doc in crds:
            (args.out / f"crd-{doc['metadata']['name']}.json").write_text(json.dumps(doc))
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as e:
        print(f"render.py: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
