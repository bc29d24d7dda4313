"""A CycloneDX 1.6 SBOM (JSON) of an OCI image archive: ``sbom.py ARCHIVE REFERENCE``.

What it covers: what the image's filesystem says is installed, read from its layers in order
(a later layer's file, or whiteout, wins): every Debian package in ``var/lib/dpkg/status``
(installed ones; ``pkg:deb/debian/<name>@<version>?arch=<arch>``) and every Python
distribution with a ``*.dist-info/METADATA`` anywhere (the venv's: reclaimd, the SDK and their
dependencies; the system Python's own, if any; ``pkg:pypi/<name>@<version>``), each with its
license as its metadata states it. Not covered: files no package manager installed, and what
the packages vendor inside themselves. Only the standard library: no scanner needed.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tarfile
import uuid
from datetime import UTC, datetime
from email.parser import HeaderParser
from pathlib import PurePosixPath
from typing import Any

DPKG_STATUS = "var/lib/dpkg/status"
DIST_INFO = re.compile(r".*/[^/]+\.dist-info/METADATA")


def _read(t: tarfile.TarFile, name: str) -> bytes:
    f = t.extractfile(name)
    if f is None:
        raise ValueError(f"{name}: not in the archive")
    return f.read()


def image_files(archive: str) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The files the SBOM reads (dpkg status, dist-info METADATA) as the image has them, and
    the image's config."""
    with tarfile.open(archive) as t:
        index = json.loads(_read(t, "index.json"))
        digest = index["manifests"][0]["digest"]
        manifest = json.loads(_read(t, "blobs/" + digest.replace(":", "/")))
        config = json.loads(_read(t, "blobs/" + manifest["config"]["digest"].replace(":", "/")))
        files: dict[str, bytes] = {}
        for layer in manifest["layers"]:
            blob = t.extractfile("blobs/" + layer["digest"].replace(":", "/"))
            assert blob is not None
            with tarfile.open(fileobj=blob, mode="r|*") as lt:
                for m in lt:
                    name = m.name.lstrip("./")
                    base = PurePosixPath(name).name
                    if base.startswith(".wh."):
                        gone = str(PurePosixPath(name).parent / base[4:])
                        for k in [k for k in files if k == gone or k.startswith(gone + "/")]:
                            del files[k]
                    elif m.isfile() and (name == DPKG_STATUS or DIST_INFO.fullmatch(name)):
                        f = lt.extractfile(m)
                        files[name] = f.read() if f is not None else b""
    return files, config


def debian_components(status: str, arch: str) -> list[dict[str, Any]]:
    out = []
    for stanza in status.split("\n\n"):
        fields = dict(
            (k, v.strip()) for k, _, v in (ln.partition(":") for ln in stanza.splitlines()
                                         if ln and not ln[0].isspace())
        )
        if "install ok installed" not in fields.get("Status", ""):
            continue
        name, version = fields["Package"], fields["Version"]
        a = fields.get("Architecture", arch)
        out.append({
            "type": "library",
            "name": name,
            "version": version,
            "purl": f"pkg:deb/debian/{name}@{version}?arch={a}",
            "bom-ref": f"pkg:deb/debian/{name}@{version}?arch={a}",
        })
    return out


def python_components(metadata: dict[str, bytes]) -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path, body in sorted(metadata.items()):
        msg = HeaderParser().parsestr(body.decode("utf-8", "replace"))
        name = re.sub(r"[-_.]+", "-", msg["Name"] or "").lower()
        version = msg["Version"] or ""
        if not name:
            continue
        purl = f"pkg:pypi/{name}@{version}"
        c: dict[str, Any] = {
            "type": "library", "name": name, "version": version, "purl": purl, "bom-ref": purl,
            "properties": [{"name": "reclaimd:path", "value": str(PurePosixPath(path).parent)}],
        }
        lic = msg.get("License-Expression") or msg.get("License") or ""
        if lic and len(lic) < 100 and "\n" not in lic:
            c["licenses"] = [{"license": {"name": lic}}]
        out.setdefault(purl, c)
    return list(out.values())


def sbom(archive: str, reference: str) -> dict[str, Any]:
    files, config = image_files(archive)
    arch = config.get("architecture", "amd64")
    repository, _, version = reference.rpartition(":")
    components = debian_components(files.get(DPKG_STATUS, b"").decode("utf-8", "replace"), arch)
    components += python_components({k: v for k, v in files.items() if k != DPKG_STATUS})
    h = hashlib.sha256()
    with open(archive, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tools": {"components": [{"type": "application", "name": "deploy/release/sbom.py"}]},
            "component": {
                "type": "container",
                "name": repository,
                "version": version,
                "bom-ref": reference,
                "hashes": [{"alg": "SHA-256", "content": h.hexdigest()}],
                "properties": [
                    {"name": "oci:platform", "value": f"{config.get('os')}/{arch}"},
                    {"name": "reclaimd:covers", "value": "dpkg status; Python dist-info"},
                ],
            },
        },
        "components": components,
    }


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: sbom.py ARCHIVE REFERENCE")
    json.dump(sbom(sys.argv[1], sys.argv[2]), sys.stdout, indent=1)
    sys.stdout.write("\n")
