# One entry point per job. Everything installs into .venv from the project's own files.
PY      ?= python3.11
VENV    ?= .venv
BIN     := $(VENV)/bin
PYTHON  := $(BIN)/python
DATA    ?= data
RUNS    ?= runs
STORE   ?= model_store
DEVICE  ?= cpu
# All three variants are validated and measured; int8 (CPU default) and fp16 (GPU) are shipped.
# These are the bundled store's choices, not export.publish's defaults (fp32,int8 serving fp32,
# figures on 500 test rows): the bundled figures are measured on the whole test split.
EXPORT_FLAGS ?= --variants fp32,int8,fp16 --ship int8,fp16 --default-variant int8 --test-rows 0

.PHONY: install data train train-classifier train-translator models browser test test-fast lint bench bench-engine clean k8s-check image-check

$(BIN)/activate:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/activate
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

data: install
	@command -v npm >/dev/null || DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends npm
	$(PYTHON) -m export.data --data-dir $(DATA)

# Default models: the bundled runs, step for step (docs/data-and-training.md). Each run resumes
# from its last evaluation when interrupted: run the same command again. DEVICE=cuda trains on a GPU.
# The bundled classifier's pre-training saw text as written and its fine-tuning `sentence_case`
# (docs/data-and-training.md); a run of this target has it from the start.
train-classifier: install
	$(PYTHON) -m export.train classifier --data-dir $(DATA) --out $(RUNS)/sentiment --device $(DEVICE) \
		--threads 1 --no-amp --pretrain-steps 6000 --pretrain-eval-every 500 --steps 3000 --eval-every 250 --patience 6 \
		--repeat uci_amazon=3 --repeat uci_imdb=3 --repeat uci_yelp=3

# The bundled translator was planned for 10000 steps, shortened to 6500 at step 2500 and continued
# to 8500 after it finished (the learning-rate decay follows the new length from each change), all
# before the command-line catalogs joined the data: the three commands replay that run's schedule
# without them. Then 3000 steps from those weights with the first round of command-line catalogs,
# and 3500 more with the second (each with a fresh optimiser): `added` in GETTEXT_SOURCES.
sources_since = $(shell $(PYTHON) -c "from export.data import GETTEXT_SOURCES as s; print(*(x.package for x in s if x.added >= $(1)))")
TRANSLATOR_FLAGS = --data-dir $(DATA) --out $(RUNS)/en-de --device $(DEVICE) \
	--threads 1 --no-amp --lr 1.5e-3 --warmup 400 --eval-every 500 --patience 8 \
	$(foreach s,$(call sources_since,1),--exclude-source $(s))
train-translator: install
	$(PYTHON) -m export.train translator $(TRANSLATOR_FLAGS) --steps 10000 --stop-at 2500
	$(PYTHON) -m export.train translator $(TRANSLATOR_FLAGS) --steps 6500
	$(PYTHON) -m export.train translator $(TRANSLATOR_FLAGS) --steps 8500
	$(PYTHON) -m export.train translator --data-dir $(DATA) --out $(RUNS)/en-de-cli --init $(RUNS)/en-de \
		--device $(DEVICE) --threads 2 --no-amp --lr 4e-4 --warmup 200 --steps 3000 --eval-every 250 --patience 8 \
		$(foreach s,$(call sources_since,2),--exclude-source $(s))
	$(PYTHON) -m export.train translator --data-dir $(DATA) --out $(RUNS)/en-de-cli2 --init $(RUNS)/en-de-cli \
		--device $(DEVICE) --threads 2 --no-amp --lr 3e-4 --warmup 200 --steps 3500 --eval-every 250 --patience 8

train: train-classifier train-translator

# Rebuild the bundled store from scratch: data -> training -> validated export.
models: data train
	$(PYTHON) -m export.publish $(RUNS)/sentiment --name sentiment --store $(STORE) --version 1 --force --data-dir $(DATA) $(EXPORT_FLAGS)
	$(PYTHON) -m export.publish $(RUNS)/en-de-cli2 --name en-de --store $(STORE) --version 1 --force --data-dir $(DATA) $(EXPORT_FLAGS) \
		--length-penalty 1.2 --early-stopping false

# The whole path in under a minute, after `make data` (docs/export.md#the-tiny-path): tiny models
# trained and published into their own store; serve it with SERVE_MODEL_STORE=runs/tiny-store make serve.
TINY_STORE ?= $(RUNS)/tiny-store
.PHONY: tiny
tiny: install
	$(PYTHON) -m export.train classifier --tiny --data-dir $(DATA) --out $(RUNS)/tiny-sentiment
	$(PYTHON) -m export.train translator --tiny --data-dir $(DATA) --out $(RUNS)/tiny-en-de
	$(PYTHON) -m export.publish $(RUNS)/tiny-sentiment --name sentiment --store $(TINY_STORE) --force --version 1 --data-dir $(DATA)
	$(PYTHON) -m export.publish $(RUNS)/tiny-en-de --name en-de --store $(TINY_STORE) --force --version 1 --data-dir $(DATA)

# Serve the store (docs/serving.md): settings from SERVE_* variables, or flags in ARGS
# (make serve ARGS="--port 9000"); 127.0.0.1:8000 by default.
.PHONY: serve bench-service
serve: install
	SERVE_MODEL_STORE=$${SERVE_MODEL_STORE:-$(STORE)} $(BIN)/transformer-serve serve $(ARGS)

# Load benchmark of the real server against the engine offline (a report; run it on an idle machine).
# Writes bench/results/service.json. Smoke run: $(PYTHON) -m bench.service_load --smoke
bench-service: install
	@command -v wrk >/dev/null || DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends wrk
	$(PYTHON) -m bench.service_load --store $(STORE)

# Peer comparison (bench/peer.py): the server against LitServe 0.2.19 serving the same engines, same
# CPU and threads, alternating rounds (~20 min at the defaults, an idle machine; PEER_ARGS="--rounds 7").
# Writes bench/results/peer.json. Smoke run: $(PYTHON) -m bench.peer --smoke
.PHONY: bench-peer
bench-peer: $(VENV)/.bench-installed
	@command -v wrk >/dev/null || DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends wrk
	$(PYTHON) -m bench.peer --store $(STORE) $(PEER_ARGS)

# Against the peers users pick (bench/peers.py): LitServe 0.2.19 + CTranslate2 (fp32 and int8) on one
# imported Marian checkpoint, Infinity (its ONNX backend) on one BERT classifier and one cross-encoder;
# each alone on the same CPU and threads (~12 min, an idle machine). Writes bench/results/peers.json.
# Smoke run: $(PYTHON) -m bench.peers --smoke (Infinity: `make bench-infinity-venv` first, or --no-infinity)
.PHONY: bench-peers bench-infinity-venv
INFINITY_VENV := bench/.venv-infinity
bench-peers: $(VENV)/.bench-installed $(INFINITY_VENV)/.installed
	@command -v wrk >/dev/null || DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends wrk
	$(PYTHON) -m bench.peers $(PEERS_ARGS)

# Infinity in a virtual environment of its own: it needs numpy<2 and older uvicorn, click and huggingface_hub
# than the project's. torch<2.14: the CPU wheel where one is at hand (INFINITY_PIP_ARGS: e.g. a CPU-only
# wheel index), else PyPI's. Optimum resolves to 2.x, whose API Infinity 0.0.78 predates (bench/peers.py
# says what that changes); Optimum 1.x does not import with torch 2.13.
bench-infinity-venv: $(INFINITY_VENV)/.installed
$(INFINITY_VENV)/.installed:
	$(PY) -m venv $(INFINITY_VENV) || python3 -m venv $(INFINITY_VENV)
	$(INFINITY_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(INFINITY_VENV)/bin/python -m pip install --quiet 'infinity-emb[server,torch,optimum]==0.0.78' 'torch<2.14' \
		$(INFINITY_PIP_ARGS)
	touch $@

# Rolling update through HAProxy (bench/rolling.py): two replicas replaced in turn under mixed load,
# with SERVE_DRAIN_GRACE_S 0, 1 and 2; failures and p99 before/during/after. Writes
# bench/results/rolling.json (~2 min, an idle machine). ROLLING_ARGS="--grace 2 --publish" also
# publishes a new classifier version under load and times until every replica serves it.
.PHONY: bench-rolling
bench-rolling: install
	@command -v haproxy >/dev/null || DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends haproxy
	$(PYTHON) -m bench.rolling --store $(STORE) $(ROLLING_ARGS)

# Streaming's acceptance figures (bench/streaming.py): a 20-sentence beam-4 text's first event against
# the whole answer, a greedy sentence's first event in decoder steps (~1 min, an idle machine; writes
# bench/results/streaming.json). STREAMING_ARGS="--equality": streamed deltas against whole answers
# over the test split (after `make data`) and bench/data/fidelity.jsonl, greedy and beam 4 (~4 min).
.PHONY: bench-streaming
bench-streaming: install
	$(PYTHON) -m bench.streaming --store $(STORE) --data-dir $(DATA) $(STREAMING_ARGS)

# Reliability campaign (bench/reliability.py): overload, soak, SIGTERM, hostile clients, streams left
# mid-way, faults and fuzzing against the real server; writes bench/results/reliability.json and its
# table in docs/results.md (~25 min, an idle machine). reliability-quick is the ~2 min subset .ci/run runs.
.PHONY: reliability reliability-quick fuzz
reliability: install
	$(PYTHON) -m bench.reliability --store $(STORE)

reliability-quick: install
	$(PYTHON) -m bench.reliability --quick --store $(STORE)

# schemathesis alone, every check and phase, against a server you started (URL=http://127.0.0.1:8000);
# with admin keys, FUZZ_ARGS='-H "Authorization: Bearer <admin key>"' lets it load and unload models.
# tests/test_schema_fuzz.py runs the same for 45 s, with and without keys.
URL ?= http://127.0.0.1:8000
fuzz: install
	$(BIN)/schemathesis --config-file bench/schemathesis.toml run $(URL)/openapi.json --checks all \
		--phases examples,coverage,fuzzing,stateful --max-time 600 --workers 1 $(FUZZ_ARGS)

# tests/test_page.py drives a real headless browser: Debian's chromium and its chromedriver.
CHROMIUM     ?= /usr/bin/chromium
CHROMEDRIVER ?= /usr/bin/chromedriver
SUDO         ?= $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_BROWSER  := DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends chromium chromium-driver

browser:
	@if [ ! -x $(CHROMIUM) ] || [ ! -x $(CHROMEDRIVER) ]; then \
		echo "installing chromium and chromium-driver (apt-get)"; \
		$(APT_BROWSER) || { $(SUDO) apt-get update && $(APT_BROWSER); }; \
	fi

test: install browser
	$(BIN)/pytest

# The inner loop: leaves out the tests whose markers (pyproject.toml) say they take long, fuzz, need
# a browser (so it needs no `browser`) or Hugging Face families; `make test` runs them all.
FAST_TESTS ?= not (slow or fuzz or browser or families)
test-fast: install
	$(BIN)/pytest -m "$(FAST_TESTS)"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Engine benchmark (a report, not a test): tokens/s against CTranslate2, Optimum, HF generate and PyTorch
# eager. Run it on an otherwise idle machine; it writes bench/results/engine.json and prints a markdown table.
$(VENV)/.bench-installed: pyproject.toml | $(VENV)/.installed
	$(PYTHON) -m pip install --quiet -e '.[dev,bench]'
	touch $@

# Optimum's ONNX Runtime classes: optimum-onnx (0.1.0, the newest) needs transformers<4.58, older than the
# venv's, so it and its pins live in an overlay that only the Optimum runner puts first on its PYTHONPATH
# (bench/same_model.py); torch, onnx and onnxruntime come from the venv.
OPTIMUM_OVERLAY := $(VENV)/optimum-onnx
$(OPTIMUM_OVERLAY)/.installed: | $(VENV)/.installed
	$(PYTHON) -m pip install --quiet --no-deps --target $(OPTIMUM_OVERLAY) optimum-onnx==0.1.0 optimum==2.1.0 \
		transformers==4.57.6 tokenizers==0.22.2 huggingface_hub==0.36.2
	touch $@

bench: $(VENV)/.bench-installed $(OPTIMUM_OVERLAY)/.installed
	$(PYTHON) -m bench.engine

bench-engine: bench

# Deployment (docs/deployment.md): offline manifest validation + Dockerfile lint + alert rules and
# dashboard queries through promtool (k8s/README.md; fetched from Debian's archive on first use, root
# if apt has no package lists yet); a real image build and run without a Docker daemon (root; a few
# minutes from empty).
k8s-check: install
	$(PYTHON) .ci/k8s_check.py

image-check:
	bash .ci/image_check.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
