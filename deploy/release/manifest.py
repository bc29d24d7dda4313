"""The release manifest of ``out/release/`` (``make release``): write it, check it.

    python deploy/release/manifest.py write OUT --revision SHA --image REPOSITORY
    python deploy/release/manifest.py check OUT

``write`` reads every artifact (the image's OCI archive, the chart package, the three wheels,
the SBOM) for its name, version and digest and writes ``release.json`` and ``SHA256SUMS``.
``check`` fails (exit 1, one line per problem) unless it all agrees: the chart's version and
appVersion, the image's tag (and the chart's default image: repository and an empty tag or
the version), the wheels' versions and their pins on each other, the SBOM's subject, are one
version; the image is linux/amd64; every file is in SHA256SUMS and release.json with its
digest, and nothing else is there. tests/unit/test_release.py runs it on a small fake release.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tarfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

import yaml

WHEELS = {"reclaimd": "controller", "reclaimd-chaos": "chaos", "reclaimd-trainer": "sdk"}
SUMS = "SHA256SUMS"
MANIFEST = "release.json"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_facts(path: Path) -> dict[str, Any]:
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        msg = HeaderParser().parsestr(z.read(meta).decode())
    return {
        "name": canonical(msg["Name"]),
        "version": msg["Version"],
        "requires": msg.get_all("Requires-Dist") or [],
    }


def chart_facts(path: Path) -> dict[str, Any]:
    with tarfile.open(path) as t:
        chart = yaml.safe_load(_member(t, "reclaimd/Chart.yaml"))
        values = yaml.safe_load(_member(t, "reclaimd/values.yaml"))
    return {
        "name": chart["name"],
        "version": str(chart["version"]),
        "appVersion": str(chart["appVersion"]),
        "image": {"repository": values["image"]["repository"], "tag": values["image"]["tag"]},
    }


def _member(t: tarfile.TarFile, name: str) -> bytes:
    f = t.extractfile(name)
    if f is None:
        raise ValueError(f"{name}: not a file")
    return f.read()


def image_facts(path: Path) -> dict[str, Any]:
    """The OCI archive's reference (index.json's ref.name) and platform (its config)."""
    with tarfile.open(path) as t:
        index = json.loads(_member(t, "index.json"))
        (desc,) = index["manifests"]
        ref = desc.get("annotations", {}).get("org.opencontainers.image.ref.name", "")
        manifest = json.loads(_member(t, _blob(desc["digest"])))
        config = json.loads(_member(t, _blob(manifest["config"]["digest"])))
    repository, _, tag = ref.rpartition(":")
    return {
        "reference": ref,
        "repository": repository,
        "tag": tag,
        "platform": f"{config.get('os')}/{config.get('architecture')}",
        "manifestDigest": desc["digest"],
    }


def _blob(digest: str) -> str:
    algo, _, hexdigest = digest.partition(":")
    return f"blobs/{algo}/{hexdigest}"


def sbom_facts(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    subject = doc["metadata"]["component"]
    return {
        "format": f"{doc['bomFormat']} {doc['specVersion']}",
        "subject": subject["name"],
        "version": subject["version"],
        "components": len(doc["components"]),
        "pypi": {
            canonical(c["name"]): c["version"]
            for c in doc["components"]
            if c.get("purl", "").startswith("pkg:pypi/")
        },
    }


def classify(out: Path) -> dict[str, Path]:
    """Each artifact's role by its file name."""
    found: dict[str, Path] = {}
    for p in sorted(out.iterdir()):
        if p.name in (SUMS, MANIFEST):
            continue
        if p.name.endswith(".oci.tar"):
            found["image"] = p
        elif p.name.endswith(".sbom.cdx.json"):
            found["sbom"] = p
        elif p.name.endswith(".tgz"):
            found["chart"] = p
        elif p.name.endswith(".whl"):
            found[WHEELS.get(canonical(p.name.split("-", 1)[0]), p.name)] = p
        else:
            found[p.name] = p
    return found


def write(out: Path, revision: str, image: str) -> dict[str, Any]:
    files = classify(out)
    chart = chart_facts(files["chart"])
    doc: dict[str, Any] = {
        "version": chart["appVersion"],
        "revision": revision,
        "image": image,
        "artifacts": {},
    }
    facts = {
        "image": image_facts,
        "chart": chart_facts,
        "sbom": sbom_facts,
        **dict.fromkeys(WHEELS.values(), wheel_facts),
    }
    for role, path in files.items():
        entry: dict[str, Any] = {
            "file": path.name,
            "size": path.stat().st_size,
            "sha256": sha256(path),
        }
        if role in facts:
            entry.update({k: v for k, v in facts[role](path).items() if k != "pypi"})
        doc["artifacts"][role] = entry
    (out / MANIFEST).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    sums = "".join(f"{sha256(p)}  {p.name}\n" for p in sorted(files.values()))
    sums += f"{sha256(out / MANIFEST)}  {MANIFEST}\n"
    (out / SUMS).write_text(sums, encoding="utf-8")
    return doc


def check(out: Path) -> list[str]:
    problems: list[str] = []
    files = classify(out)
    missing = {"image", "chart", "sbom", *WHEELS.values()} - files.keys()
    problems += [f"{role}: missing" for role in sorted(missing)]
    problems += [f"{name}: not a release artifact" for name in sorted(files) if name not in
                 {"image", "chart", "sbom", *WHEELS.values()}]
    if missing:
        return problems
    chart = chart_facts(files["chart"])
    version = chart["appVersion"]
    if chart["version"] != version:
        problems.append(f"chart: version {chart['version']} but appVersion {version}")
    image = image_facts(files["image"])
    if image["tag"] != version:
        problems.append(f"image: tagged {image['reference']!r}, not {version}")
    if image["platform"] != "linux/amd64":
        problems.append(f"image: {image['platform']}, not linux/amd64")
    if chart["image"]["repository"] != image["repository"]:
        problems.append(
            f"chart: default image {chart['image']['repository']}, the release's "
            f"{image['repository']}"
        )
    if chart["image"]["tag"] not in ("", version):
        problems.append(f"chart: default image tag {chart['image']['tag']}, not {version}")
    for role in WHEELS.values():
        w = wheel_facts(files[role])
        if w["version"] != version:
            problems.append(f"{files[role].name}: version {w['version']}, not {version}")
        pins = {canonical(re.split(r"[=<>!~ ;\[]", r, maxsplit=1)[0]): r for r in w["requires"]}
        for dep in WHEELS:
            if dep in pins and f"=={version}" not in pins[dep]:
                problems.append(f"{files[role].name}: requires {pins[dep]!r}, not =={version}")
    sbom = sbom_facts(files["sbom"])
    if (sbom["subject"], sbom["version"]) != (image["repository"], version):
        problems.append(f"sbom: describes {sbom['subject']} {sbom['version']}")
    for dist in ("reclaimd", "reclaimd-trainer"):
        if sbom["pypi"].get(dist) != version:
            problems.append(f"sbom: {dist} {sbom['pypi'].get(dist)}, not {version}")
    problems += _check_sums(out, files)
    return problems


def _check_sums(out: Path, files: dict[str, Path]) -> list[str]:
    problems: list[str] = []
    sums_path, manifest_path = out / SUMS, out / MANIFEST
    if not sums_path.exists() or not manifest_path.exists():
        return [f"{p.name}: missing" for p in (sums_path, manifest_path) if not p.exists()]
    listed: dict[str, str] = {}
    for line in sums_path.read_text(encoding="utf-8").splitlines():
        digest, _, name = line.partition("  ")
        listed[name] = digest
    names = {p.name for p in files.values()} | {MANIFEST}
    for name in sorted(names | listed.keys()):
        if name not in listed:
            problems.append(f"{SUMS}: {name} not listed")
        elif name not in names:
            problems.append(f"{SUMS}: lists {name}, which is not there")
        elif sha256(out / name) != listed[name]:
            problems.append(f"{SUMS}: {name} does not match its checksum")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    for role, path in files.items():
        entry = manifest["artifacts"].get(role, {})
        if entry.get("file") != path.name or entry.get("sha256") != listed.get(path.name):
            problems.append(f"{MANIFEST}: {role} is not {path.name} with its checksum")
    return problems


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("action", choices=["write", "check"])
    ap.add_argument("out", type=Path)
    ap.add_argument("--revision", default="")
    ap.add_argument("--image", default="ghcr.io/reclaimd/reclaimd")
    a = ap.parse_args(argv)
    if a.action == "write":
        write(a.out, a.revision, a.image)
        return 0
    problems = check(a.out)
    for p in problems:
        print(f"release: {p}", file=sys.stderr)
    if not problems:
        print(f"release: {a.out} agrees: one version, checksums verify")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
