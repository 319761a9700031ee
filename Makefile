# Quick start: `make setup` (then translate with the shipped model), `make demo`, `make train`
# and `make test`; each sets up .venv and the shipped model first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# make train's recipe, chosen by the CPU like --mixed_precision=auto (issue 42): with
# bfloat16 instructions its 1.8 hours buy about 10,700-14,800 updates, and rnnsearch.flags
# (the conditional GRU decoder, the rate decayed over the last 20 % of the budget) is best;
# without them, about 5,600-6,160 float32 updates (5,600 measured on an AVX2-only CPU),
# where rnnsearch_float32.flags (the same with
# less dropout and the plateau schedule) is
# (pipelines/multi30k_en_fr/README.md). FLAGFILE=... chooses yourself
# (on a GPU machine: pipelines/multi30k_en_fr/rnnsearch.flags).
RECIPES := pipelines/multi30k_en_fr
FLAGFILE ?= $(RECIPES)/$(shell $(PY) -c "from nmt_tf.core import hardware; \
    print('rnnsearch.flags' if hardware.bf16_cpu_flags() else 'rnnsearch_float32.flags')")
MODEL_DIR ?= runs/multi30k_en_fr_rnnsearch
# Test processes (pytest-xdist); each test file runs whole in one of them.
TEST_WORKERS ?= 2

# The model shipped in nmt_tf/presets/ that `make setup` builds, and the page's port.
PRESET ?= multi30k_en_fr
DEMO_PORT ?= 8501

.PHONY: setup train test test-quick test-fast test-durations demo

# Reinstalls when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

# Builds the shipped model's SavedModel into the cache (~/.cache/nmt_tf) once;
# later runs find it there at once (rebuilt when the preset or the code changes).
setup: $(VENV)/.installed
	$(PY) -m nmt_tf.presets --build=$(PRESET) > /dev/null

# The translation page of the shipped model: http://127.0.0.1:$(DEMO_PORT)/ (Ctrl-C stops it).
demo: setup
	$(PY) -m nmt_tf.serve --preset=$(PRESET) --host=127.0.0.1 --port=0 --rest_api_port=$(DEMO_PORT)

# The recipe's file must exist: if the CPU check above failed (its error is printed
# above this one), FLAGFILE is the folder alone.
train: setup
	@test -f "$(FLAGFILE)" || { echo "make train: no recipe file '$(FLAGFILE)' (choose one with FLAGFILE=$(RECIPES)/rnnsearch.flags; the CPU check is $(PY) -c 'from nmt_tf.core import hardware; hardware.bf16_cpu_flags()')" >&2; exit 2; }
	$(PY) -m nmt_tf.train --flagfile=$(FLAGFILE) --model_dir=$(MODEL_DIR)
	$(PY) -m nmt_tf.shortlist --model_dir=$(MODEL_DIR)

test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

# The quick tier: the tests that train, export, serve or start no tool (tests/conftest.py marks the rest
# slow); about a minute on 2 cores, for after every change. `make test` is the whole suite.
test-quick: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow" tests

# The one-minute tier: the quick tier without its tests that took seconds last time (tests/durations.json,
# which test-durations records again on a quiet machine; tests/conftest.py marks them heavy).
test-fast: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow and not heavy" tests

test-durations: setup
	NMT_TF_RECORD_DURATIONS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow" tests
