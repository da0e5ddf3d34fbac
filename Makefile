# damptune — every target a user or CI runs. `make help` lists them.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help setup setup-gpu run smoke stack-up stack-down stack-status deploy dashboard test \
	test-fast check-install docs docs-check lint bench accuracy clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# constraints.txt: the exact tested versions of everything (pyproject.toml gives ranges)
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: where pip has a local CPU wheel of 2.13.0 (find-links) it takes it and the
	# install of the rest keeps it; elsewhere this is PyPI's CUDA build (see setup-gpu)
	$(BIN)/pip install -q -c constraints.txt "torch==2.13.0"
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP) ## create .venv and install damptune with its pinned dependencies

# pip takes a wheel from find-links first (here /opt/wheels holds torch 2.13.0+cpu, set in
# pip's config file); an empty PIP_FIND_LINKS does not override the config, an empty directory
# does, so pip goes to the index (PyPI), whose torch 2.13.0 Linux wheel is the CUDA 13.0 build
NO_LINKS := $(CURDIR)/$(VENV)/.no-find-links
setup-gpu: $(STAMP) ## replace the CPU torch by PyPI's CUDA build of torch 2.13.0 (GPU machines)
	mkdir -p $(NO_LINKS)
	PIP_FIND_LINKS=$(NO_LINKS) $(BIN)/pip install -q --force-reinstall --no-deps "torch==2.13.0"
	PIP_FIND_LINKS=$(NO_LINKS) $(BIN)/pip install -q -c constraints.txt "torch==2.13.0"  # its nvidia-* packages
	$(BIN)/python -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, \
		'GPUs', torch.cuda.device_count())"

# RUN_ARGS: more options of infra.main, e.g. the flow's parameters for this run only:
#   make run RUN_ARGS='--param trials=8 --param validation_seeds=0'
RUN_ARGS ?=
run: $(STAMP) ## the main job: stack up, deploy, run tune/grid, wait, print summary and UIs
	$(BIN)/python -m infra.main --grid grid $(RUN_ARGS)

smoke: $(STAMP) ## the main job on the small grid (tune/smoke): a few minutes
	$(BIN)/python -m infra.main --grid smoke

stack-up: $(STAMP) ## start Prefect server + worker and MLflow server on 127.0.0.1 (runs/stack)
	$(BIN)/python -m infra.stack up

stack-down: ## stop the local stack (worker, Prefect server, MLflow) by PID
	$(BIN)/python -m infra.stack down

stack-status: ## PID and health of each service of the local stack
	$(BIN)/python -m infra.stack status

# the server PREFECT_API_URL names when it is set (no local stack), else the local stack's;
# PREFECT_FILE=infra/prefect-git.yaml: the deployments that clone the repository (any host)
PREFECT_FILE ?= prefect.yaml
deploy: $(STAMP) ## register prefect.yaml's deployments with $PREFECT_API_URL, else the local stack
	if [ -n "$$PREFECT_API_URL" ]; then echo "deploying to $$PREFECT_API_URL"; \
	else $(BIN)/python -m infra.stack up && . runs/stack/stack.env; fi && \
	PWD=$(CURDIR) $(BIN)/prefect --no-prompt deploy --all --prefect-file $(PREFECT_FILE)

# `make dashboard GRID=smoke` for the smoke grid's run directory, STORAGE=URL for any other
# Optuna storage; DASHBOARD_PORT to move it
GRID ?= grid
STORAGE ?= sqlite:///runs/$(GRID)/optuna.db
DASHBOARD_PORT ?= 8080
DASHBOARD_STAMP := $(VENV)/.dashboard-installed
$(DASHBOARD_STAMP): $(STAMP)
	$(BIN)/pip install -q -e ".[dashboard]"
	touch $(DASHBOARD_STAMP)

dashboard: $(DASHBOARD_STAMP) ## Optuna dashboard on runs/grid/optuna.db, 127.0.0.1:8080 (GRID=smoke)
	$(BIN)/python -m infra.dashboard --storage $(STORAGE) --port $(DASHBOARD_PORT)

# two pytest processes (pytest-xdist), a test file on one of them at a time: the suite waits on
# servers, subprocesses, heartbeats and signals, so two share the 2 cores (three: slower, the
# tests contend for the cores; measured on a fresh clone, 28 min 00 s of pytest against 25:56);
# `make test PYTEST_WORKERS=0` runs it in one process
PYTEST_WORKERS ?= 2
test: $(STAMP) ## run the whole test suite (what CI runs)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile

test-fast: $(STAMP) ## the tests without those marked slow
	$(BIN)/python -m pytest -m "not slow"

# a fresh virtualenv in a temporary directory, `pip install -c constraints.txt .` (not editable),
# then `damptune tune` on one tiny cell from another temporary directory; minutes, not in
# `make test`
check-install: ## non-editable install check: the run directory lands where damptune runs
	$(PY) infra/check_install.py

docs: $(STAMP) ## write the generated docs: parameter and CLI references, README's tables
	$(BIN)/python -m infra.docs

docs-check: $(STAMP) ## fail where a generated doc is stale (what tests/infra/test_docs.py checks)
	$(BIN)/python -m infra.docs --check

lint: $(STAMP) ## ruff on everything, mypy on the engine, tasks and flows
	$(BIN)/ruff check damptune models tasks flows tests bench infra
	$(BIN)/mypy

bench: $(STAMP) ## step-time benchmark: both modes against plain PyTorch DDP
	$(BIN)/python -m bench step_time

# every bench appends a record to bench/results/<name>.jsonl; `python -m bench list` lists them
.PHONY: bench-report timed-run timed-smoke timed-test
bench-report: ## render docs/benchmarks.md from the bench records (bench/results/*.jsonl)
	$(BIN)/python -m bench report

# the install is timed too (no .venv prerequisite; the wrapper needs only the standard library):
# run them on a fresh clone, as a user's first `make run` / CI's `make test` are
timed-run: ## make run, its wall time and status recorded (bench/results/make-run.jsonl)
	$(PY) -m bench time make-run -- $(MAKE) run

timed-smoke: ## make smoke, its wall time and status recorded (bench/results/make-smoke.jsonl)
	$(PY) -m bench time make-smoke -- $(MAKE) smoke

timed-test: ## make test, its wall time and status recorded (bench/results/make-test.jsonl)
	$(PY) -m bench time make-test -- $(MAKE) test

accuracy: $(STAMP) ## test accuracy of the MLP and CNN on MNIST-1D (single process)
	$(BIN)/python -m models.accuracy

clean: ## remove the virtualenv and run outputs
	rm -rf $(VENV) runs dask-scratch-space .pytest_cache .mypy_cache .ruff_cache
