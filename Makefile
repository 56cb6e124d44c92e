# One entry point per job. Everything installs into .venv from the project's own files.
PY      ?= python3.11
VENV    ?= .venv
BIN     := $(VENV)/bin
PYTHON  := $(BIN)/python
DATA    ?= data
RUNS    ?= runs
STORE   ?= model_store
DEVICE  ?= cpu

.PHONY: install data train train-classifier train-translator models test lint bench bench-engine clean k8s-check image-check

$(BIN)/activate:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/activate
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

data: install
	$(PYTHON) -m export.data --data-dir $(DATA)

# Default models: the figures in the README come from these exact commands (2-core CPU).
train-classifier: install
	$(PYTHON) -m export.train classifier --data-dir $(DATA) --out $(RUNS)/sentiment --device $(DEVICE)

train-translator: install
	$(PYTHON) -m export.train translator --data-dir $(DATA) --out $(RUNS)/en-de --device $(DEVICE)

train: train-classifier train-translator

# Rebuild the bundled store from scratch: data -> training -> validated export.
models: data train
	$(PYTHON) -m export.onnx $(RUNS)/sentiment --name sentiment --store $(STORE) --version 1 --force --data-dir $(DATA)
	$(PYTHON) -m export.onnx $(RUNS)/en-de --name en-de --store $(STORE) --version 1 --force --data-dir $(DATA)

# Serve the store (README, "Serving"): settings from SERVE_* variables, 127.0.0.1:8000 by default.
.PHONY: serve bench-service
serve: install
	SERVE_MODEL_STORE=$${SERVE_MODEL_STORE:-$(STORE)} $(PYTHON) -m service

# Load benchmark of the real server against the engine offline (a report; run it on an idle machine).
# Writes bench/results/service.json. Smoke run: $(PYTHON) bench/service_load.py --fallback-store DIR --smoke
bench-service: install
	$(PYTHON) bench/service_load.py --store $(STORE)

test: install
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Engine benchmark (a report, not a test): tokens/s against CTranslate2, HF generate and PyTorch eager.
# Run it on an otherwise idle machine; it writes bench/results/engine.json and prints a markdown table.
$(VENV)/.bench-installed: pyproject.toml | $(VENV)/.installed
	$(PYTHON) -m pip install --quiet -e '.[dev,bench]'
	touch $@

bench: $(VENV)/.bench-installed
	$(PYTHON) bench/engine.py

bench-engine: bench

# Deployment (README, "Deployment"): offline manifest validation + Dockerfile lint; a real image
# build and run without a Docker daemon (root; a few minutes from empty).
k8s-check: install
	$(PYTHON) .ci/k8s_check.py

image-check:
	bash .ci/image_check.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
