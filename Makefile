# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-from-pyproject

.PHONY: run test lint unit bench venv java clean

run: venv
	$(BIN)/spark-cnn demo

test: venv
	$(BIN)/ruff check .
	$(BIN)/pytest -q

# The unit tests that start no process: under a minute.
unit: venv
	$(BIN)/pytest -q -m "not slow" tests/unit

# All variants, both models, about 15 minutes on a 2-core machine; run it on a quiet machine.
bench: venv
	$(BIN)/spark-cnn bench --json docs/bench.json --plot docs/bench.png

lint: venv
	$(BIN)/ruff check .

venv: java $(STAMP)

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
