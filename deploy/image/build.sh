#!/usr/bin/env bash
# `make image`: reclaimd's OCI image, built without Docker or a registry.
#
#   1. base:   a Debian root filesystem from Debian's packages (mmdebstrap --variant=minbase,
#              python3 + venv + CA certificates), imported into buildah as FROM-scratch image;
#              cached in ~/.cache/reclaimd/image-base-<suite>/ (rebuilt only when removed).
#   2. wheels: reclaimd and its dependencies as wheels, built on the host (the build has no
#              network: pip inside a build fails on this machine's TLS interception).
#   3. image:  Containerfile with BASE=the step-1 image, buildah with OCI isolation and runc
#              (crun refuses this machine's cgroups), no network; output an OCI archive.
#
# The archive is cached in ~/.cache/reclaimd/image-<version>-<sources hash>/reclaimd.oci.tar,
# the hash covering everything that goes into the image; a cache hit costs a few seconds.
# Prints the archive's path as the last line of stdout.
set -euo pipefail
LOG_TAG=image
source "$(dirname "${BASH_SOURCE[0]}")/../local/lib.sh"

# podman/buildah's default open-files limit is above this machine's hard limit.
ULIMITS=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
BUILDAH=(buildah --cgroup-manager cgroupfs)
# The base is keyed by its recipe (the function below), so a changed recipe builds a new one.
base_key() { declare -f build_base_rootfs | sha256sum | cut -c1-8; }
LOGS=$CACHE_DIR/logs

# The image is built from a commit (IMAGE_REV, default HEAD), never from the work tree: the
# tree is shared, and someone's half-done edit must not end up in an image.
IMAGE_REV=${IMAGE_REV:-HEAD}
IMAGE_PATHS=(Containerfile pyproject.toml README.md reclaimd handlers)

sources_hash() {
    # The git object ids of everything that goes into the image.
    local p
    for p in "${IMAGE_PATHS[@]}"; do
        git -C "$REPO_DIR" rev-parse --verify -q "$IMAGE_REV:$p" || die "$IMAGE_REV has no $p"
    done | sha256sum | cut -c1-12
}

version() {
    sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO_DIR/pyproject.toml" | head -n 1
}

build_base_rootfs() {
    # Debian's own mirror, as the host's apt uses it; minbase + what a venv needs.
    # No docs, man pages or translations (the copyright files stay); no apt lists or caches.
    nice -n 10 mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        --aptopt='Acquire::Check-Valid-Until "false"' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*' \
        "$DEBIAN_SUITE" "$1/rootfs.tar" \
        "deb http://deb.debian.org/debian $DEBIAN_SUITE main" \
        "deb http://deb.debian.org/debian $DEBIAN_SUITE-updates main" \
        "deb http://deb.debian.org/debian-security $DEBIAN_SUITE-security main" </dev/null
}

ensure_base() {
    if [[ ! -f $BASE_DIR/rootfs.tar ]]; then
        say "base: mmdebstrap $DEBIAN_SUITE into $BASE_DIR (log: $LOGS/image-base.log)"
        rm -rf "$BASE_DIR.partial"
        mkdir -p "$BASE_DIR.partial"
        run_long image-base "$LOGS/image-base.log" build_base_rootfs "$BASE_DIR.partial"
        rm -rf "$BASE_DIR"
        mv "$BASE_DIR.partial" "$BASE_DIR"
    fi
    if ! "${BUILDAH[@]}" inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
        printf 'FROM scratch\nADD rootfs.tar /\n' >"$BASE_DIR/Containerfile"
        run_long image-base-import "$LOGS/image-base.log" "${BUILDAH[@]}" bud \
            --isolation oci --runtime runc "${ULIMITS[@]}" --network none \
            -f "$BASE_DIR/Containerfile" -t "$BASE_IMAGE" "$BASE_DIR"
    fi
}

build_wheels() {
    # The commit's product files: reclaimd and handlers, not the rig (chaos/ is not archived,
    # so the wheel built here has no chaos package).
    local ctx=$1 src=$1/src
    mkdir -p "$src" "$ctx/wheels"
    git -C "$REPO_DIR" archive --format=tar "$IMAGE_REV" "${IMAGE_PATHS[@]}" | tar -x -C "$src"
    cp "$src/Containerfile" "$ctx/Containerfile"
    nice -n 10 "$REPO_DIR/.venv/bin/pip" wheel -q --wheel-dir "$ctx/wheels" "$src"
    rm -rf "$src"
}

build_image() {
    local ctx=$1 out=$2 tag=$3
    nice -n 10 "${BUILDAH[@]}" bud --isolation oci --runtime runc "${ULIMITS[@]}" \
        --network none --layers=false --build-arg "BASE=$BASE_IMAGE" \
        -f "$ctx/Containerfile" -t "$tag" "$ctx"
    "${BUILDAH[@]}" push "$tag" "oci-archive:$out/reclaimd.oci.tar:$tag"
}

# Every commit that touches the sources is a new image: keep the newest KEEP_IMAGES archives
# (and their tags in the container storage), drop older ones.
KEEP_IMAGES=${KEEP_IMAGES:-2}
prune() {
    local old
    while IFS= read -r old; do
        [[ -n $old ]] || continue
        "${BUILDAH[@]}" rmi "$(cat "$old/tag" 2>/dev/null)" >/dev/null 2>&1 || true
        rm -rf "$old"
        say "pruned $old"
    done < <(ls -1dt "$CACHE_DIR"/image-[0-9]*[0-9a-f] 2>/dev/null | tail -n +$((KEEP_IMAGES + 1)))
}

main() {
    BASE_DIR=$CACHE_DIR/image-base-$DEBIAN_SUITE-$(base_key)
    BASE_IMAGE=localhost/reclaimd-base:$DEBIAN_SUITE-$(base_key)
    local cmd
    for cmd in mmdebstrap buildah runc; do
        command -v "$cmd" >/dev/null || die "$cmd is missing; run deploy/image/tools.sh"
    done
    local ver hash dir tag start=$SECONDS
    ver=$(version)
    # The image's key covers its sources, the Containerfile and the base recipe.
    hash=$( (sources_hash; base_key) | sha256sum | cut -c1-12)
    dir=$CACHE_DIR/image-$ver-$hash
    tag=localhost/reclaimd:$ver-$hash
    if [[ -f $dir/reclaimd.oci.tar ]]; then
        say "image $tag: cached ($dir)" >&2
        echo "$dir/reclaimd.oci.tar"
        return
    fi
    mkdir -p "$LOGS"
    exec 9>"$CACHE_DIR/.image.lock"
    flock 9
    ensure_base >&2
    rm -rf "$dir.partial"
    mkdir -p "$dir.partial/context"
    run_long wheels "$LOGS/image-wheels.log" build_wheels "$dir.partial/context" >&2
    run_long image "$LOGS/image.log" build_image "$dir.partial/context" "$dir.partial" "$tag" >&2
    rm -rf "$dir.partial/context"
    echo "$tag" >"$dir.partial/tag"
    mv "$dir.partial" "$dir"
    prune >&2
    say "image $tag: built in $(fmt_secs $((SECONDS - start))), $(du -h "$dir/reclaimd.oci.tar" | cut -f1) archive" >&2
    echo "$dir/reclaimd.oci.tar"
}

main "$@"
