#!/usr/bin/env bash
# torch (CPU use of the PyPI CUDA build: the CPU-only index is not reachable here), Lightning
# and transformers (+ accelerate) for the trainer SDK's tests and bench, into the project venv,
# and the wheels the SDK's s3/aio extras need (for the docs test's SDK-only venv). The wheels are
# downloaded once into ~/.cache/reclaimd/wheels (about 2.9 GB, most of it nvidia-* wheels) and
# installed offline from there; a venv that already has these versions is left alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=versions.env
source deploy/trainer/versions.env
PY=${VENV:-.venv}/bin/python
CACHE=${RECLAIMD_CACHE:-$HOME/.cache/reclaimd}/wheels
REQS=("torch==$TORCH_VERSION" "lightning==$LIGHTNING_VERSION" "transformers==$TRANSFORMERS_VERSION"
      "accelerate==$ACCELERATE_VERSION")

have() {
  "$PY" - "$TORCH_VERSION" "$LIGHTNING_VERSION" "$TRANSFORMERS_VERSION" "$ACCELERATE_VERSION" \
    <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
have = (version("torch").split("+")[0], version("lightning"), version("transformers"),
        version("accelerate"))
sys.exit(0 if have == tuple(sys.argv[1:5]) else 1)
PYEOF
}

# What the SDK's other extras need (s3: boto3, tenacity; aio: aiohttp; and its own
# dependencies), cached beside the frameworks: tests/e2e/test_trainer_docs.py installs the SDK's
# wheel with all of them offline from here into a venv of its own. Once per set of requirements.
mapfile -t SDK_REQS < <("$PY" - <<'PYEOF'
import tomllib
project = tomllib.load(open("deploy/trainer/sdk/pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
for req in [*project["dependencies"], *extras["s3"], *extras["aio"]]:
    print(req)
PYEOF
)
mkdir -p "$CACHE"
stamp=$CACHE/.sdk-deps-$(printf '%s\n' "${SDK_REQS[@]}" | sha256sum | cut -c1-12)
if [[ ! -f $stamp ]]; then
  echo "trainer deps: downloading the SDK's extras' requirements (${SDK_REQS[*]}) into $CACHE"
  "$PY" -m pip download -q -d "$CACHE" "${SDK_REQS[@]}"
  touch "$stamp"
fi

if have; then
  echo "torch $TORCH_VERSION, lightning $LIGHTNING_VERSION, transformers $TRANSFORMERS_VERSION: installed"
  exit 0
fi
mkdir -p "$CACHE"
start=$(date +%s)
before=$(du -sb "$CACHE" | cut -f1)
echo "trainer deps: downloading ${REQS[*]} into $CACHE (first time: about 2.9 GB)"
# pip download skips wheels already in the directory; the progress bars go to the terminal.
"$PY" -m pip download --progress-bar on -d "$CACHE" "${REQS[@]}"
after=$(du -sb "$CACHE" | cut -f1)
mid=$(date +%s)
echo "trainer deps: downloaded $(( (after - before) / 1000000 )) MB in $(( mid - start )) s"
"$PY" -m pip install --no-index --find-links "$CACHE" "${REQS[@]}"
echo "trainer deps: installed in $(( $(date +%s) - mid )) s (total $(( $(date +%s) - start )) s)"
