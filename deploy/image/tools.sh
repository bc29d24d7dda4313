#!/usr/bin/env bash
# Install what `make image` and the image test need, from Debian's packages: mmdebstrap makes the
# base root filesystem, buildah builds the image, runc runs it (crun refuses this machine's
# hybrid cgroups), podman runs it in the test, umoci/skopeo unpack and copy OCI archives.
# Idempotent: only missing tools are installed.
set -euo pipefail
LOG_TAG=image-tools
source "$(dirname "${BASH_SOURCE[0]}")/../local/lib.sh"

# command -> Debian package
declare -A PKG=([mmdebstrap]=mmdebstrap [buildah]=buildah [podman]=podman [runc]=runc
    [umoci]=umoci [skopeo]=skopeo)

missing=()
for cmd in "${!PKG[@]}"; do
    command -v "$cmd" >/dev/null || missing+=("${PKG[$cmd]}")
done
if ((${#missing[@]} == 0)); then
    say "image tools: all present"
    exit 0
fi
command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
((EUID == 0)) || die "missing ${missing[*]}; run as root (apt-get install)"
run_long image-tools "$CACHE_DIR/logs/image-tools.log" env DEBIAN_FRONTEND=noninteractive \
    sh -c "apt-get update -q && apt-get install -y -q --no-install-recommends ${missing[*]}"
