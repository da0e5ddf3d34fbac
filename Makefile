# damptune — every target a user or CI runs. `make help` lists them.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help setup run test test-fast lint bench accuracy clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-11s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the pinned CPU wheel first: a looser torch requirement would pull GBs of CUDA packages
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP) ## create .venv and install damptune with its pinned dependencies

run: $(STAMP) ## the main job: train a CNN on MNIST-1D with GeoDamp on a local Dask cluster
	$(BIN)/damptune train --model cnn --dataset mnist1d --damper geodamp --initial 32 \
		--param factor=2 --param delay=8 --lr 0.05 --epochs 40 --workers 4 \
		--per-worker-batch 64 --mode decentralized

test: $(STAMP) ## run the whole test suite (what CI runs)
	$(BIN)/python -m pytest

test-fast: $(STAMP) ## the tests without those marked slow
	$(BIN)/python -m pytest -m "not slow"

lint: $(STAMP) ## ruff on everything, mypy on the engine
	$(BIN)/ruff check damptune models tasks flows tests bench
	$(BIN)/mypy

bench: $(STAMP) ## step-time benchmark: both modes against plain PyTorch DDP
	$(BIN)/python bench/step_time.py

accuracy: $(STAMP) ## test accuracy of the MLP and CNN on MNIST-1D (single process)
	$(BIN)/python -m models.accuracy

clean: ## remove the virtualenv and run outputs
	rm -rf $(VENV) runs dask-scratch-space .pytest_cache .mypy_cache .ruff_cache
