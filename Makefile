# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-from-pyproject

.PHONY: run test lint unit bench bench-identity bench-device-budget bench-zoo bench-heldout bench-generated bench-noisy-calibration venv java clean

run: venv
	$(BIN)/spark-cnn demo

# Three pytest workers, a test file each at a time (module fixtures stay whole): 2-core AMD host, whole suite 1971 s
# serial, 1428 s with two workers, 1267 s with three; 1126 s since the driver JVMs map a class archive and the
# command line loads no torch. Both cores were busy in a /proc profile by process (docs/benchmarks.md, "The
# driver JVM's start"). Each worker has its own sidecar
# directory and device cache (tests/conftest.py), and needs about 3 GB of memory: make test TEST_WORKERS=2.
TEST_WORKERS ?= 3
test: venv
	$(BIN)/ruff check .
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile

# The unit tests that start no process: under a minute.
unit: venv
	$(BIN)/pytest -q tests/unit

# All variants, both models, three rounds (each figure with its spread): about 45 minutes on a 2-core machine;
# run it on a quiet machine.
bench: venv
	$(BIN)/spark-cnn bench --repeats 3 --json docs/bench.json --plot docs/bench.png

# The framework's own cost (issue 17): the near-free model, so the limit is decoding alone; spark_cnn with the
# tasks decoding and with the sidecar decoding (a GPU host's path), against predict_batch_udf and the peers.
bench-identity: venv
	$(BIN)/spark-cnn bench --models identity --variants predict_batch_udf spark_cnn spark_cnn_sidecar_decode \
		ray_data daft limit --json docs/bench-identity.json

# A GPU node's CPU budget (issue 36): a simulated H200 behind the whole pipeline, both decode paths, CPU per image
# at steady state beyond decoding against 0.3 ms, three rounds; about 6 minutes on a 2-core machine, quiet.
bench-device-budget: venv
	$(BIN)/spark-cnn bench --models sim:resnet50-h200 --variants spark_cnn spark_cnn_sidecar_decode limit \
		--repeats 3 --json docs/bench-device-budget.json

# The time model on every torchvision classifier under 9.5 GFLOPs (docs/perf-model.md, "The zoo"): about 75
# minutes on a 2-core machine at these batch sizes, two sweeps back to back so the table carries its own noise;
# resumable (a rerun measures only what docs/zoo.json lacks; more batch sizes add only theirs: make bench-zoo
# ZOO_ARGS="--batch-sizes 1,2,4,8,16,32,64 --sweeps 2 --calibrate-each"). Each network is judged against a
# calibration made just before it (kept in docs/zoo-profiles/): a host's speed drifts by the hour, so points
# added later are judged against a new calibration; start a fresh file to compare sweeps. Quiet machine; never
# part of `make test`.
ZOO_ARGS ?= --batch-sizes 1,8,32,64 --sweeps 2 --calibrate-each
bench-zoo: venv
	$(BIN)/spark-cnn validate --zoo $(ZOO_ARGS) --json docs/zoo.json --markdown docs/zoo.md

# The same judgement over the 12 timm networks held out from the time model's development (docs/zoo-heldout.md;
# about 45 minutes). Three sweeps, each point the fastest of its three, as bench-generated (docs/benchmarks.md,
# "Three sweeps"). A fresh file measures every point again; one that holds them only judges them again.
bench-heldout: venv
	$(BIN)/spark-cnn validate --heldout --batch-sizes 1,8,32,64 --sweeps 3 --calibrate-each \
		--json docs/zoo-heldout.json --markdown docs/zoo-heldout.md

# The same judgement over 10 hand-written networks from no zoo, drawn from a seed committed before they were
# measured (spark_cnn.perf_tools.generated_nets; docs/zoo-generated.md; about 20 minutes). No seed is given here.
# Three sweeps, each over every batch size in turn, and each point the fastest of its three: in one run on the
# 2-core guest each sweep alone judged 6-7 of 10 picks good, missing different networks each time, where the three
# together judged 9 (docs/benchmarks.md). Start a fresh file: sweeps added later meet a later calibration.
bench-generated: venv
	$(BIN)/spark-cnn validate --generated --batch-sizes 1,8,32,64 --sweeps 3 --calibrate-each \
		--json docs/zoo-generated.json --markdown docs/zoo-generated.md

# Issue 36's noisy-host target: a calibration under injected, switching load, and the tuner's pick from it against
# the best measured (median of 3 sweeps >= 95%) on mobilenet_v3_small and resnet18. About 3 minutes; quiet host.
bench-noisy-calibration: venv
	SPARK_CNN_BENCH=1 $(BIN)/pytest -q -s tests/integration/test_calibration_under_load.py

lint: venv
	$(BIN)/ruff check .

# The driver JVM's archive of Spark's classes (spark/jvm_archive.py): built once per JDK and Spark jars (about a
# minute on 2 cores), it takes a local session's start from 17 s to 10 s there; it is kept in ~/.cache/spark_cnn/jvm.
venv: java $(STAMP)
	@$(BIN)/python -m spark_cnn.spark.jvm_archive

# Spark 4 needs Java 17+; the script installs a headless JRE when it can, else says what to install.
java:
	@bash scripts/ensure-java.sh

# Re-installs whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

clean:
	rm -rf build .pytest_cache .ruff_cache
