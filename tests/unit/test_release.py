"""`make release`'s manifest (deploy/release/manifest.py) over a small fake out/release/.

The fake is made of the checkout's own facts: the chart package holds the real Chart.yaml and
values.yaml, the wheels carry the versions and pins of the real pyproject files, and the image
archive is an OCI layout with a Debian status file and dist-info as the image's venv has them,
its SBOM written by deploy/release/sbom.py. So the release check fails when the checkout's
versions disagree, as well as when an artifact is wrong or tampered with.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import tarfile
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "reclaimd"
IMAGE = "ghcr.io/reclaimd/reclaimd"
PYPROJECTS = {
    "reclaimd": REPO / "pyproject.toml",
    "reclaimd-chaos": REPO / "deploy" / "chaos" / "pyproject.toml",
    "reclaimd-trainer": REPO / "deploy" / "trainer" / "sdk" / "pyproject.toml",
}


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "deploy" / "release" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


manifest = load("manifest")
sbom = load("sbom")


def project(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = tomllib.loads(PYPROJECTS[name].read_text(encoding="utf-8"))["project"]
    return doc


VERSION = project("reclaimd")["version"]


def add(t: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    t.addfile(info, io.BytesIO(data))


def blob(t: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    add(t, f"blobs/sha256/{digest}", data)
    return f"sha256:{digest}"


def metadata(name: str, version: str, requires: tuple[str, ...] | list[str] = ()) -> bytes:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    return ("\n".join(lines) + "\n\n").encode()


def oci_archive(path: Path, reference: str, arch: str = "amd64") -> None:
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w:gz") as lt:
        add(lt, "var/lib/dpkg/status", (
            b"Package: python3.11\nStatus: install ok installed\nArchitecture: amd64\n"
            b"Version: 3.11.2-6\n\nPackage: gone\nStatus: deinstall ok config-files\n"
            b"Version: 1\n"
        ))
        site = "opt/reclaimd/venv/lib/python3.11/site-packages"
        for dist in ("reclaimd", "reclaimd_trainer", "boto3"):
            version = "1.40.0" if dist == "boto3" else VERSION
            add(lt, f"{site}/{dist}-{version}.dist-info/METADATA", metadata(dist, version))
        add(lt, f"{site}/stale-1.0.dist-info/METADATA", metadata("stale", "1.0"))
        add(lt, f"{site}/.wh.stale-1.0.dist-info", b"")
    with tarfile.open(path, "w") as t:
        config = blob(t, json.dumps({"os": "linux", "architecture": arch}).encode())
        layer_digest = blob(t, layer.getvalue())
        man = blob(t, json.dumps({
            "schemaVersion": 2,
            "config": {"digest": config},
            "layers": [{"digest": layer_digest}],
        }).encode())
        add(t, "index.json", json.dumps({"schemaVersion": 2, "manifests": [{
            "digest": man,
            "annotations": {"org.opencontainers.image.ref.name": reference},
        }]}).encode())


def chart_package(path: Path, **chart_changes: str) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    chart.update(chart_changes)
    with tarfile.open(path, "w:gz") as t:
        add(t, "reclaimd/Chart.yaml", yaml.safe_dump(chart).encode())
        add(t, "reclaimd/values.yaml", (CHART / "values.yaml").read_bytes())


def wheel(out: Path, dist: str, version: str | None = None) -> None:
    p = project(dist)
    version = version or p["version"]
    stem = f"{dist.replace('-', '_')}-{version}"
    requires = list(p.get("dependencies", []))
    for extra, deps in p.get("optional-dependencies", {}).items():
        requires += [f'{d}; extra == "{extra}"' for d in deps]
    with zipfile.ZipFile(out / f"{stem}-py3-none-any.whl", "w") as z:
        z.writestr(f"{stem}.dist-info/METADATA", metadata(dist, version, requires))


def fake_release(out: Path) -> Path:
    out.mkdir()
    image = out / f"reclaimd-{VERSION}-linux-amd64.oci.tar"
    oci_archive(image, f"{IMAGE}:{VERSION}")
    chart_package(out / f"reclaimd-{VERSION}.tgz")
    for dist in PYPROJECTS:
        wheel(out, dist)
    doc = sbom.sbom(str(image), f"{IMAGE}:{VERSION}")
    (out / f"reclaimd-{VERSION}.sbom.cdx.json").write_text(json.dumps(doc), encoding="utf-8")
    manifest.write(out, "0" * 40, IMAGE)
    return out


@pytest.fixture
def release(tmp_path: Path) -> Path:
    return fake_release(tmp_path / "release")


def test_the_checkouts_versions_agree() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert {p["version"] for p in map(project, PYPROJECTS)} == {VERSION}
    assert chart["version"] == chart["appVersion"] == VERSION
    assert values["image"]["repository"] == IMAGE
    assert values["image"]["tag"] in ("", VERSION)


def test_a_release_that_agrees_passes(release: Path) -> None:
    assert manifest.check(release) == []
    doc = json.loads((release / "release.json").read_text(encoding="utf-8"))
    assert doc["version"] == VERSION
    arts = doc["artifacts"]
    assert arts["image"]["reference"] == f"{IMAGE}:{VERSION}"
    assert arts["image"]["platform"] == "linux/amd64"
    assert {arts[r]["name"] for r in ("controller", "chaos", "sdk")} == set(PYPROJECTS)
    sums = (release / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    assert len(sums) == 7  # image, chart, three wheels, SBOM, release.json; nothing else
    assert all(
        hashlib.sha256((release / name).read_bytes()).hexdigest() == digest
        for digest, name in (line.split("  ") for line in sums)
    )


def test_the_sbom_reads_the_layers(release: Path) -> None:
    doc = json.loads(next(release.glob("*.sbom.cdx.json")).read_text(encoding="utf-8"))
    assert (doc["bomFormat"], doc["specVersion"]) == ("CycloneDX", "1.6")
    purls = {c["purl"] for c in doc["components"]}
    assert purls == {
        "pkg:deb/debian/python3.11@3.11.2-6?arch=amd64",
        f"pkg:pypi/reclaimd@{VERSION}",
        f"pkg:pypi/reclaimd-trainer@{VERSION}",
        "pkg:pypi/boto3@1.40.0",
    }  # not the deinstalled package, not the whited-out dist
    assert doc["metadata"]["component"]["version"] == VERSION


def rewrite(release: Path) -> list[str]:
    manifest.write(release, "0" * 40, IMAGE)
    problems: list[str] = manifest.check(release)
    return problems


def test_a_chart_of_another_appversion_fails(release: Path) -> None:
    chart_package(release / f"reclaimd-{VERSION}.tgz", appVersion="9.9.9")
    assert any("appVersion" in p for p in rewrite(release))


def test_an_image_of_another_tag_or_platform_fails(release: Path) -> None:
    image = next(release.glob("*.oci.tar"))
    oci_archive(image, f"{IMAGE}:latest", arch="arm64")
    problems = rewrite(release)
    assert any("image: tagged" in p for p in problems)
    assert any("not linux/amd64" in p for p in problems)


def test_a_wheel_of_another_version_fails(release: Path) -> None:
    next(release.glob("reclaimd_chaos-*.whl")).unlink()
    assert manifest.check(release) != []  # missing from the release, still in SHA256SUMS
    wheel(release, "reclaimd-chaos", "0.0.1")
    assert any("reclaimd_chaos-0.0.1" in p for p in rewrite(release))


def test_a_changed_file_fails_its_checksum(release: Path) -> None:
    with next(release.glob("*.sbom.cdx.json")).open("a", encoding="utf-8") as f:
        f.write(" ")
    problems = manifest.check(release)
    assert any("does not match its checksum" in p for p in problems)
