#!/usr/bin/env bash
# `make release`: everything a release publishes, built from HEAD into out/release/.
#
#   reclaimd-<v>-linux-amd64.oci.tar      the image (deploy/image/build.sh; its cache is reused),
#                                         named ghcr.io/reclaimd/reclaimd:<v> inside the archive
#                                         (RELEASE_IMAGE=<repository> to name another). amd64
#                                         only: buildah builds for the host, and this machine has
#                                         no binfmt/qemu for arm64.
#   reclaimd-<v>.tgz                      the chart (`helm package`; `helm push` to an OCI registry)
#   reclaimd-<v>-py3-none-any.whl         the controller (no chaos/, no reclaimd_trainer/)
#   reclaimd_chaos-<v>-py3-none-any.whl   the drill rig (deploy/chaos/build.py)
#   reclaimd_trainer-<v>-py3-none-any.whl the trainer SDK (deploy/trainer/sdk/build.py)
#   reclaimd-<v>.sbom.cdx.json            CycloneDX 1.6 of the image: every Debian package
#                                         (dpkg status) and Python distribution (dist-info)
#                                         installed in its layers (deploy/release/sbom.py)
#   release.json                          names, versions, sizes, sha256 of the above
#   SHA256SUMS                            `sha256sum -c SHA256SUMS` in out/release/
#
# Then deploy/release/manifest.py checks it all agrees (chart appVersion = image tag = wheel
# versions, checksums verify) and fails the release otherwise. Wheels, chart and SBOM are built
# from a `git archive` of HEAD (like the image), never from the shared work tree.
set -euo pipefail
LOG_TAG=release
source "$(dirname "${BASH_SOURCE[0]}")/../local/lib.sh"

OUT=${RELEASE_OUT:-$REPO_DIR/out/release}
IMAGE_REPO=${RELEASE_IMAGE:-ghcr.io/reclaimd/reclaimd}
HELM=${HELM:-$CACHE_DIR/helm-$HELM_VERSION/helm}
PY=$REPO_DIR/.venv/bin/python
[[ -x $HELM ]] || die "no helm at $HELM; run deploy/helm/tools.sh (make deploy-tools)"
command -v skopeo >/dev/null || die "skopeo is missing; run deploy/image/tools.sh"

start=$SECONDS
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO_DIR/pyproject.toml" | head -n 1)
[[ -n $version ]] || die "no version in pyproject.toml"
rev=$(git -C "$REPO_DIR" rev-parse HEAD)
say "reclaimd $version at ${rev:0:12} into $OUT"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$OUT"
mkdir -p "$OUT" "$work/src"
git -C "$REPO_DIR" archive --format=tar HEAD | tar -x -C "$work/src"

# The image: build.sh builds HEAD too (cached per commit); re-named for the registry.
archive=$("$REPO_DIR/deploy/image/build.sh" | tail -n 1)
skopeo copy -q "oci-archive:$archive" \
    "oci-archive:$OUT/reclaimd-$version-linux-amd64.oci.tar:$IMAGE_REPO:$version"
say "image: $IMAGE_REPO:$version (linux/amd64)"

# The wheels.
nice -n 10 "$PY" "$work/src/deploy/trainer/sdk/build.py" "$OUT" >/dev/null
nice -n 10 "$PY" "$work/src/deploy/chaos/build.py" "$OUT" >/dev/null
rm -rf "$work/src/chaos" "$work/src/reclaimd_trainer"
nice -n 10 "$REPO_DIR/.venv/bin/pip" wheel -q --no-deps --no-build-isolation \
    --wheel-dir "$OUT" "$work/src"
say "wheels: $(cd "$OUT" && ls ./*.whl | tr '\n' ' ')"

# The chart (its symlinked dashboard makes helm warn on stderr: not an error).
"$HELM" package "$work/src/deploy/helm/reclaimd" --destination "$OUT" \
    2> >(grep -v 'found symbolic link in path' >&2) >/dev/null
say "chart: reclaimd-$version.tgz"

"$PY" "$REPO_DIR/deploy/release/sbom.py" "$OUT/reclaimd-$version-linux-amd64.oci.tar" \
    "$IMAGE_REPO:$version" >"$OUT/reclaimd-$version.sbom.cdx.json"

"$PY" "$REPO_DIR/deploy/release/manifest.py" write "$OUT" --revision "$rev" --image "$IMAGE_REPO"
"$PY" "$REPO_DIR/deploy/release/manifest.py" check "$OUT"
(cd "$OUT" && sha256sum -c --quiet SHA256SUMS)
du -h "$OUT"/* | sed "s|$OUT/||"
say "release $version: done in $(fmt_secs $((SECONDS - start)))"
