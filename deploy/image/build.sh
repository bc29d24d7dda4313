#!/usr/bin/env bash
# `make image`: reclaimd's OCI image, built without Docker or a registry.
# `make image-chaos` (build.sh chaos): that image plus a layer with the drill rig.
#
#   1. base:   a Debian root filesystem from Debian's packages (mmdebstrap --variant=minbase,
#              python3 + venv + CA certificates), imported into buildah as FROM-scratch image;
#              cached in ~/.cache/reclaimd/image-base-<suite>/ (rebuilt only when removed).
#   2. wheels: reclaimd and its dependencies as wheels, built on the host (the build has no
#              network: pip inside a build fails on this machine's TLS interception).
#              The modules that need torch (the trainer SDK's integrations, its own wheel's
#              business: deploy/image/torch_modules.py) are left out; the build imports
#              every module it does ship (deploy/image/import_all.py).
#   3. image:  Containerfile with BASE=the step-1 image, buildah with OCI isolation and runc
#              (crun refuses this machine's cgroups), no network; output an OCI archive.
#   4. chaos:  (build.sh chaos only) the reclaimd-chaos wheel (deploy/chaos/build.py), added
#              by deploy/image/Containerfile.chaos as one layer on the step-3 image.
#
# The archive is cached in ~/.cache/reclaimd/image-<version>-<sources hash>/reclaimd.oci.tar
# (chaos: image-chaos-<version>-<hash>/), the hash covering everything that goes into the
# image; a cache hit costs a few seconds. Prints the archive's path as the last line of stdout.
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
IMAGE_PATHS=(Containerfile pyproject.toml README.md reclaimd handlers reclaimd_trainer deploy/trainer/sdk
             deploy/sidewheel.py deploy/image/torch_modules.py deploy/image/import_all.py)
# What the chaos layer adds (its own archive: the product's wheel never sees chaos/).
CHAOS_PATHS=(deploy/image/Containerfile.chaos deploy/chaos deploy/sidewheel.py chaos deploy/image/torch_modules.py deploy/image/import_all.py)
PY=$REPO_DIR/.venv/bin/python

sources_hash() {
    # The git object ids of everything that goes into the image (the paths given).
    local p
    for p in "$@"; do
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
    # so the wheel built here has no chaos package), and the trainer SDK it depends on (its own
    # wheel, reclaimd-trainer, less the integrations that need torch).
    local ctx=$1 src=$1/src
    mkdir -p "$src" "$ctx/wheels"
    git -C "$REPO_DIR" archive --format=tar "$IMAGE_REV" "${IMAGE_PATHS[@]}" | tar -x -C "$src"
    cp "$src/Containerfile" "$ctx/Containerfile"
    cp "$src/deploy/image/import_all.py" "$ctx/import_all.py"
    local left_out
    left_out=$("$PY" "$src/deploy/image/torch_modules.py" "$src" reclaimd reclaimd_trainer handlers)
    echo "left out (need torch): ${left_out//$'\n'/ }"
    # shellcheck disable=SC2086 # one path a word
    nice -n 10 "$PY" "$src/deploy/trainer/sdk/build.py" "$ctx/wheels" $left_out
    # The controller's own wheel: its pyproject leaves reclaimd_trainer/ out; the SDK it
    # requires is found in the wheel just built, not on an index.
    rm -rf "$src/reclaimd_trainer"
    nice -n 10 "$REPO_DIR/.venv/bin/pip" wheel -q --find-links "$ctx/wheels" --wheel-dir "$ctx/wheels" "$src"
    rm -rf "$src"
}

build_chaos_wheel() {
    # The commit's chaos/ as the reclaimd-chaos wheel (deploy/chaos/build.py, from the archive).
    local ctx=$1 src=$1/src
    mkdir -p "$src" "$ctx/wheels"
    git -C "$REPO_DIR" archive --format=tar "$IMAGE_REV" "${CHAOS_PATHS[@]}" | tar -x -C "$src"
    cp "$src/deploy/image/Containerfile.chaos" "$ctx/Containerfile"
    cp "$src/deploy/image/import_all.py" "$ctx/import_all.py"
    nice -n 10 "$PY" "$src/deploy/chaos/build.py" "$ctx/wheels"
    rm -rf "$src"
}

# build_image CTX OUT TAG BUILD-ARG
build_image() {
    local ctx=$1 out=$2 tag=$3 arg=$4
    nice -n 10 "${BUILDAH[@]}" bud --isolation oci --runtime runc "${ULIMITS[@]}" \
        --network none --layers=false --build-arg "$arg" \
        -f "$ctx/Containerfile" -t "$tag" "$ctx"
    "${BUILDAH[@]}" push "$tag" "oci-archive:$out/reclaimd.oci.tar:$tag"
}

# Every commit that touches the sources is a new image: keep the newest KEEP_IMAGES archives
# (and their tags in the container storage), drop older ones.
KEEP_IMAGES=${KEEP_IMAGES:-2}
prune() {
    local old glob=$1
    while IFS= read -r old; do
        [[ -n $old ]] || continue
        "${BUILDAH[@]}" rmi "$(cat "$old/tag" 2>/dev/null)" >/dev/null 2>&1 || true
        rm -rf "$old"
        say "pruned $old"
    done < <(ls -1dt "$CACHE_DIR"/$glob 2>/dev/null | tail -n +$((KEEP_IMAGES + 1)))
}

# build_cached NAME PREFIX HASH STEP...: the image NAME (reclaimd, reclaimd-chaos) keyed by
# HASH, in $CACHE_DIR/PREFIX-<version>-HASH/, built by running each STEP (a function given the
# context directory) then build_image with $BUILD_ARG, unless cached (then older ones of NAME
# are pruned). Sets ARCHIVE and TAG.
build_cached() {
    local name=$1 prefix=$2 hash=$3 step start=$SECONDS
    shift 3
    local ver dir
    ver=$(version)
    dir=$CACHE_DIR/$prefix-$ver-$hash
    TAG=localhost/$name:$ver-$hash
    ARCHIVE=$dir/reclaimd.oci.tar
    if [[ -f $ARCHIVE ]]; then
        say "image $TAG: cached ($dir)"
        return
    fi
    mkdir -p "$LOGS"
    if [[ -z ${LOCKED:-} ]]; then
        exec 9>"$CACHE_DIR/.image.lock"
        flock 9
        LOCKED=1
    fi
    [[ $name != reclaimd ]] || ensure_base  # the chaos image builds on the product, not the base
    rm -rf "$dir.partial"
    mkdir -p "$dir.partial/context"
    for step in "$@"; do
        run_long "$step" "$LOGS/$prefix-$step.log" "$step" "$dir.partial/context"
    done
    run_long "$name" "$LOGS/$prefix.log" build_image "$dir.partial/context" "$dir.partial" "$TAG" \
        "$BUILD_ARG"
    rm -rf "$dir.partial/context"
    echo "$TAG" >"$dir.partial/tag"
    mv "$dir.partial" "$dir"
    prune "$prefix-[0-9]*[0-9a-f]"
    say "image $TAG: built in $(fmt_secs $((SECONDS - start))), $(du -h "$ARCHIVE" | cut -f1) archive"
}

# The product image in buildah's storage under its tag, for the chaos image to build FROM (a
# cached archive may have outlived its tag: prune, a reset storage).
ensure_loaded() {
    local archive=$1 tag=$2 id
    "${BUILDAH[@]}" inspect --type image "$tag" >/dev/null 2>&1 && return
    id=$("${BUILDAH[@]}" pull -q "oci-archive:$archive" | tail -n 1)
    "${BUILDAH[@]}" tag "$id" "$tag"
}

main() {
    local flavor=${1:-product}
    [[ $flavor == product || $flavor == chaos ]] || die "usage: build.sh [product|chaos]"
    BASE_DIR=$CACHE_DIR/image-base-$DEBIAN_SUITE-$(base_key)
    BASE_IMAGE=localhost/reclaimd-base:$DEBIAN_SUITE-$(base_key)
    local cmd
    for cmd in mmdebstrap buildah runc; do
        command -v "$cmd" >/dev/null || die "$cmd is missing; run deploy/image/tools.sh"
    done
    local product chaos
    # The image's key covers its sources, the Containerfile and the base recipe.
    product=$( (sources_hash "${IMAGE_PATHS[@]}"; base_key) | sha256sum | cut -c1-12)
    BUILD_ARG=BASE=$BASE_IMAGE
    build_cached reclaimd image "$product" build_wheels >&2
    if [[ $flavor == chaos ]]; then
        # The chaos image's key: the product's and what its layer adds.
        chaos=$( (echo "$product"; sources_hash "${CHAOS_PATHS[@]}") | sha256sum | cut -c1-12)
        ensure_loaded "$ARCHIVE" "$TAG" >&2
        BUILD_ARG=PRODUCT=$TAG
        build_cached reclaimd-chaos image-chaos "$chaos" build_chaos_wheel >&2
    fi
    echo "$ARCHIVE"
}

main "$@"
