# Quick start: `make train` and `make test`; both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
FLAGFILE ?= pipelines/multi30k_en_fr/rnnsearch.flags
MODEL_DIR ?= runs/multi30k_en_fr_rnnsearch
# Test processes (pytest-xdist); each test file runs whole in one of them.
TEST_WORKERS ?= 2

.PHONY: setup train test

# Reinstalls when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

setup: $(VENV)/.installed

train: setup
	$(PY) -m nmt_tf.train --flagfile=$(FLAGFILE) --model_dir=$(MODEL_DIR)
	$(PY) -m nmt_tf.shortlist --model_dir=$(MODEL_DIR)

test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests
