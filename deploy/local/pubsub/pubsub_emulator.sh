# shellcheck shell=bash disable=SC2034  # sourced by install.sh and stack.sh (after lib.sh)
# The Pub/Sub emulator of the local stack, with a consistent grpc-java on its classpath.
#
# The Cloud SDK's cloud-pubsub-emulator-0.8.20-all.jar bundles grpc-java from two releases:
# grpc-api and grpc-stub from 1.70.0, grpc-core, grpc-netty, grpc-util (and grpc-services,
# -alts, -auth, -grpclb, -rls, -servlet) from 1.68.1 (class for class, byte for byte, against
# Maven Central's jars). grpc-core 1.68.1's ServerImpl calls InternalStatus.asRuntimeException
# (Status, Metadata, boolean), which 1.70.0's grpc-api no longer has: every stream that closes
# (a client's RST_STREAM, a dropped connection) throws NoSuchMethodError in
# ServerImpl$JumpToApplicationThreadServerStreamListener.closedInternal, the emulator never
# learns that the stream is gone, and it goes on leasing messages to it until each ack deadline
# runs out. Real Pub/Sub drops a closed stream at once.
#
# The fix: grpc-java's server path at the release of the jar's own grpc-core
# (PUBSUB_GRPC_VERSION, versions.env: grpc-api, grpc-context, grpc-core, grpc-netty, grpc-util,
# grpc-stub, grpc-protobuf, grpc-protobuf-lite, no transitive dependencies) from Maven Central
# into ~/.cache/reclaimd/pubsub-grpc-<version>/libs/, put ahead of the emulator's jar, and the
# jar's Main-Class started with `java -cp`. The jar itself stays where the Cloud SDK put it.
# install.sh refuses an emulator jar whose grpc-core is not PUBSUB_GRPC_VERSION (a Cloud SDK
# update): pin the version it bundles (`pubsub_jar_grpc_core` prints it).

PUBSUB_GRPC_DIR=$CACHE_DIR/pubsub-grpc-$PUBSUB_GRPC_VERSION
PUBSUB_GRPC_JARS=(grpc-api grpc-context grpc-core grpc-netty grpc-util grpc-stub grpc-protobuf
    grpc-protobuf-lite)

# pubsub_root: the emulator's directory in the Cloud SDK (bin/, lib/).
pubsub_root() {
    if [[ -z ${PUBSUB_ROOT:-} ]]; then
        local bin
        bin=$(pubsub_emulator_bin) || die "Pub/Sub emulator not found (gcloud components install pubsub-emulator)"
        PUBSUB_ROOT=$(cd "$(dirname "$bin")/.." && pwd)
    fi
    echo "$PUBSUB_ROOT"
}

# pubsub_jar: the emulator's all-in-one jar.
pubsub_jar() {
    local j
    j=$(compgen -G "$(pubsub_root)/lib/cloud-pubsub-emulator-*-all.jar" | head -n 1) ||
        die "no cloud-pubsub-emulator-*-all.jar under $(pubsub_root)/lib"
    echo "$j"
}

# pubsub_jar_version: the emulator's version, from its jar's name (0.8.20).
pubsub_jar_version() {
    local j
    j=$(pubsub_jar)
    j=${j##*/cloud-pubsub-emulator-}
    echo "${j%-all.jar}"
}

# pubsub_jar_grpc_core: the grpc-core release bundled in the jar (GrpcUtil's
# IMPLEMENTATION_VERSION, a string constant of its class file).
pubsub_jar_grpc_core() {
    unzip -p "$(pubsub_jar)" io/grpc/internal/GrpcUtil.class |
        grep -aoE '\b1\.[0-9]+\.[0-9]+\b' | head -n 1
}

# --- install.sh ------------------------------------------------------------------------------

# pubsub_grpc_check: the emulator is there and bundles the grpc-core the pin is for.
pubsub_grpc_check() {
    command -v unzip >/dev/null || die "unzip is not on PATH (reads the Pub/Sub emulator's jar)"
    local emulator core
    emulator=$(pubsub_emulator_bin) ||
        die "Pub/Sub emulator not found; install it: gcloud components install pubsub-emulator"
    say "pubsub-emulator: $emulator ($(pubsub_jar_version))"
    core=$(pubsub_jar_grpc_core)
    [[ $core == "$PUBSUB_GRPC_VERSION" ]] ||
        die "$(pubsub_jar) bundles grpc-core ${core:-unknown}, versions.env pins PUBSUB_GRPC_VERSION=$PUBSUB_GRPC_VERSION; pin the jar's"
}

build_pubsub_grpc() {
    mvn -B -f "$LOCAL_DIR/pubsub/pom.xml" dependency:copy-dependencies \
        -Dgrpc.version="$PUBSUB_GRPC_VERSION" -DexcludeTransitive=true \
        -DincludeScope=runtime -DoutputDirectory="$1/libs"
    local a
    for a in "${PUBSUB_GRPC_JARS[@]}"; do
        [[ -f $1/libs/$a-$PUBSUB_GRPC_VERSION.jar ]] ||
            die "maven did not fetch $a-$PUBSUB_GRPC_VERSION.jar"
    done
}

# pubsub_grpc_list: one line naming the jars the emulator's classpath starts with.
pubsub_grpc_list() {
    local f names=()
    for f in "$PUBSUB_GRPC_DIR"/libs/*.jar; do names+=("${f##*/}"); done
    say "pubsub-emulator: classpath starts with ${names[*]}"
}

# --- stack.sh --------------------------------------------------------------------------------

# pubsub_emulator_cmd: fill CMD with the emulator on 127.0.0.1:18085, grpc first.
pubsub_emulator_cmd() {
    local jar main
    jar=$(pubsub_jar)
    [[ -f $PUBSUB_GRPC_DIR/libs/grpc-core-$PUBSUB_GRPC_VERSION.jar ]] ||
        die "$PUBSUB_GRPC_DIR is missing; run deploy/local/install.sh"
    main=$(unzip -p "$jar" META-INF/MANIFEST.MF | sed -n 's/^Main-Class: *\([^[:space:]]*\).*/\1/p')
    [[ -n $main ]] || die "$jar names no Main-Class"
    CMD=(java -Xmx256m -cp "$PUBSUB_GRPC_DIR/libs/*:$jar" "$main" --host=127.0.0.1 --port=18085)
}
