# Developer and CI entry points. Recipes stay short: the logic lives in deploy/local/*.sh.
#   make test          lint, bring the local stack up, run unit + e2e tests in one pytest run
#   make stack-up      build/fetch what is missing and start the local stack (idempotent)
#   make stack-status  table of the stack's servers; fails if one is down
#   make stack-down    stop what stack-up started (data under .stack/ is kept)
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STACK := deploy/local/stack.sh

.PHONY: venv demo test bench stack-up stack-down stack-status lint image deploy-tools

# Re-installs when a pyproject is newer than the stamp (new or changed dependencies). The
# trainer SDK (reclaimd-trainer, deploy/trainer/sdk) is installed editable with the controller,
# which depends on it.
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml deploy/trainer/sdk/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e deploy/trainer/sdk -e '.[dev]'
	touch $@

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

stack-up: venv
	$(STACK) up

stack-down: venv
	$(STACK) down

stack-status: venv
	$(STACK) status

# trainer-deps (torch, Lightning; end of this file) first: mypy and the trainer tests import them.
test: trainer-deps lint stack-up deploy-tools
	$(BIN)/pytest -v -ra tests

# A zone-wide storm drill judged against ground truth, one Spot warning shown step by step,
# then what the storm cost: its ledger, a meter and an hourly bill over its fleet
# (chaos/demo/fleet.py) in reclaimd report, by queue, with "does spot pay?"; the demo ends on
# that picture (.stack/demo-report.html).
demo: stack-up
	$(BIN)/reclaimd drill run chaos/scenarios/spot-az-storm.yaml --timeline \
		--json .stack/demo-storm.json --svg .stack/demo-slowest-notice.svg
	$(BIN)/python -m chaos.demo.run
	$(BIN)/python -m chaos.demo.report .stack/demo-storm.json .stack/demo-report.html

bench: stack-up
	$(BIN)/python -m chaos.bench.latency

# A zone-wide storm at the apiserver's own limit: calibrate node PATCH/s, then the
# spot-az-storm-1000 drill on 2 replicas: out/bench-storm.json and a table.
# BENCH_STORM_ARGS="--cache" adds the cache RSS bench (5,000 nodes, 50,000 pods).
.PHONY: bench-storm
bench-storm: stack-up
	$(BIN)/python -m chaos.bench.storm $(BENCH_STORM_ARGS)

# Every deadline with 1,000 simultaneous notices: the spot-storm-1000-notices drill, same
# table and checks as bench-storm (out/bench-storm-1000.json).
.PHONY: bench-storm-1000
bench-storm-1000: stack-up
	$(BIN)/python -m chaos.bench.storm --scenario chaos/scenarios/spot-storm-1000-notices.yaml --calibrate-messages 1000 --out out/bench-storm-1000.json --drill-json out/bench-storm-1000-drill.json $(BENCH_STORM_ARGS)

# The same 1,000-notice storm through the Kafka notices topic (CloudEvents, 120 s deadlines):
# the intake calibrated in the run (one plain consumer), then the kafka-storm-1000 drill
# (out/bench-storm-kafka.json).
.PHONY: bench-storm-kafka
bench-storm-kafka: stack-up
	$(BIN)/python -m chaos.bench.storm --scenario chaos/scenarios/kafka-storm-1000.yaml --calibrate-messages 1000 --no-every-source --out out/bench-storm-kafka.json --drill-json out/bench-storm-kafka-drill.json $(BENCH_STORM_ARGS)

# The same storm through the Pub/Sub emulator (GCE preemption LogEntries on 1,000 GCE nodes,
# 120 s windows): out/bench-storm-pubsub.json.
.PHONY: bench-storm-pubsub
bench-storm-pubsub: stack-up
	$(BIN)/python -m chaos.bench.storm --scenario chaos/scenarios/pubsub-storm-1000.yaml --calibrate-messages 1000 --no-every-source --out out/bench-storm-pubsub.json --drill-json out/bench-storm-pubsub-drill.json $(BENCH_STORM_ARGS)

# The informer cache's RSS with 5,000 nodes and 50,000 pods (10,000 GPU) created straight in
# the apiserver, deleted afterwards: out/bench-cache.json. BENCH_CACHE_ARGS="--nodes 500 ...".
.PHONY: bench-cache
bench-cache: stack-up
	$(BIN)/python -m chaos.bench.cache $(BENCH_CACHE_ARGS)

# One Spot storm through released aws-node-termination-handler (built once from the Go module
# proxy) and through reclaimd, side by side: out/bench-peers.json and a table.
# BENCH_PEERS_ARGS="--nodes 50 --repeat 1" for a quick run.
.PHONY: bench-peers
bench-peers: stack-up
	$(BIN)/python -m chaos.bench.peers.run $(BENCH_PEERS_ARGS)

# What the in-cluster tests need: buildah/podman/runc/mmdebstrap (apt), helm (Go module proxy).
deploy-tools:
	deploy/image/tools.sh
	deploy/helm/tools.sh

# The OCI image, built from HEAD without Docker (deploy/image/build.sh); cached per commit in
# ~/.cache/reclaimd/image-<version>-<hash>/reclaimd.oci.tar.
image: venv deploy-tools
	deploy/image/build.sh

# The chaos image: that image plus one layer, the reclaimd-chaos wheel (`reclaimd drill`, the
# shipped scenarios under /opt/reclaimd/scenarios), for the chart's drill Job (`helm test`).
# Cached like the image, in ~/.cache/reclaimd/image-chaos-<version>-<hash>/reclaimd.oci.tar.
.PHONY: image-chaos
image-chaos: venv deploy-tools
	deploy/image/build.sh chaos

# 500 ranks of one tenant upload their checkpoints to a moto of its own, each paced at the
# share of the tenant's PutObject budget reclaimd hands it, through a proxy answering 10 % with
# 503 SlowDown: out/bench-uploads.json and a table. No stack needed; about 90 s.
# BENCH_UPLOADS_ARGS="--ranks 50 --objects 2" for a quick run.
.PHONY: bench-uploads
bench-uploads: venv
	$(BIN)/python -m chaos.bench.uploads $(BENCH_UPLOADS_ARGS)

# 10,000 hostile messages per transport (SQS, Pub/Sub, Kafka notices, Kueue Workloads, IMDS, GCE
# metadata and Azure Scheduled Events answers) with real notices mixed in, against one
# `reclaimd run`: crashes, every message counted and acked, RSS over time, every real notice
# claimed. out/bench-fuzz.json and a table. BENCH_FUZZ_ARGS="--per-transport 500" for a quick run.
.PHONY: bench-fuzz
bench-fuzz: stack-up
	$(BIN)/python -m chaos.bench.fuzz.run $(BENCH_FUZZ_ARGS)

# A randomized fault campaign (chaos/bench/failover/): 20 drills, each a storm with a random source
# mix and 1-3 faults (kill, restart, fresh disk, pause, term, successor, partition, Kafka or
# apiserver down) from a recorded seed, judged by the drills' ground-truth checks: one row per
# run and the total; out/bench-failover.json, each run's scenario in out/failover/<seed>.yaml.
# FAILOVER_ARGS="--runs 5 --seed 7"; a failing run reruns with "--runs 1 --seed <its seed>".
.PHONY: bench-failover
bench-failover: stack-up
	$(BIN)/python -m chaos.bench.failover.run --out out/bench-failover.json $(FAILOVER_ARGS)

# torch 2.15.0 (the PyPI CUDA build, used on CPU) and Lightning for the trainer SDK's tests and
# bench: wheels cached under ~/.cache/reclaimd/wheels (about 2.9 GB once), installed offline.
.PHONY: trainer-deps
trainer-deps: venv
	deploy/trainer/torch.sh

# The trainer SDK as its own wheel, reclaimd-trainer (import name reclaimd_trainer; no controller
# file or library; s3, aio, torch, lightning and hf are extras):
# out/reclaimd_trainer-<version>-py3-none-any.whl.
.PHONY: sdk-wheel
sdk-wheel: venv
	$(BIN)/python deploy/trainer/sdk/build.py out

# The drill rig as its own wheel, reclaimd-chaos (chaos/ and its scenarios, without the torch
# jobs; requires reclaimd at the same version): out/reclaimd_chaos-<version>-py3-none-any.whl.
# `pip install reclaimd[chaos]` installs it; it adds `reclaimd drill`.
.PHONY: chaos-wheel
chaos-wheel: venv
	$(BIN)/python deploy/chaos/build.py out

# The trainer side (reclaimd_trainer.torch) with a real gloo job: save time (stash, upload),
# ack latency, bytes/s against the disk's and moto's own rates, model sizes small to large:
# out/bench-trainer.json and a table. BENCH_TRAINER_ARGS="--sizes 1,16" for a quick run.
.PHONY: bench-trainer
bench-trainer: trainer-deps
	$(BIN)/python -m chaos.bench.trainer $(BENCH_TRAINER_ARGS)

# The FinOps report at fleet scale: a generated month of a 2,000-node GPU fleet (FOCUS in
# Parquet, ~6.8 M rows; allocation rows; 100,000 restart-waste events), reported in DuckDB
# against DuckDB's raw scan of the same files, then the same report.sql in a local Trino
# (deploy/local/trino.sh; trino-server from Maven Central): out/bench-report.json and a table.
# BENCH_REPORT_ARGS="--nodes 200 --hours 72 --events 5000" for a quick run.
.PHONY: bench-report
bench-report: venv
	$(BIN)/python -m chaos.bench.report $(BENCH_REPORT_ARGS)

# A soak (chaos/bench/soak.py): 10 minutes of notices from every central source (SQS, Pub/Sub,
# Kafka notices) on 2 replicas, every fault kind in turn (kill+restart, rolling upgrade, pause,
# Kafka down, partition, apiserver restart, fresh disk, Pub/Sub and moto restarts), judged as
# every drill is, with each replica's RSS over time and every GCE notice's send -> claim:
# out/bench-soak.json (the drill's report and scenario in out/soak/) and a table.
# BENCH_SOAK_ARGS="--minutes 4" for a shorter run; "--kinds pause,stop_kafka" for some faults.
.PHONY: bench-soak
bench-soak: stack-up
	$(BIN)/python -m chaos.bench.soak $(BENCH_SOAK_ARGS)

# Everything a release publishes, from HEAD, into out/release/ (deploy/release/release.sh): the
# image as an OCI archive (linux/amd64), the chart package, the controller, chaos and SDK wheels,
# a CycloneDX SBOM of the image, release.json and SHA256SUMS, checked to agree on one version
# (deploy/release/manifest.py). How to push them: docs/release.md. Image cached per commit.
.PHONY: release
release: venv deploy-tools
	deploy/release/release.sh
