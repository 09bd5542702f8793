# `make help` lists the targets. Everything runs from a virtualenv that `make venv` creates.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NPROC  ?= 4
LAUNCHER ?= lab
TOPOLOGY ?= plain
SCHEDULER ?= none
NAME ?= lab
LAB_UP_ARGS ?=
BENCH ?=
REPEAT ?= 3
# the suite on several workers (pytest-xdist; tests/conftest.py groups what must run one at a time):
# two lanes by default, the container labs' tests in one, the rest beside them (README)
WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(WORKERS) --dist loadgroup --no-loadscope-reorder

.DEFAULT_GOAL := help
.PHONY: help venv python-venv test test-host test-unit lint docs bench run list lab-up lab-down lab-status clean

help: ## show the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-12s %s\n", $$1, $$2}'

venv: $(STAMP) ## create .venv, install the dependencies (requirements*.txt) and the lab itself: `lab` on the venv's PATH
	@# (its bytecode, brought up to date: Python reads it even where PYTHONDONTWRITEBYTECODE keeps it from
	@# writing its own, and compiling the lab's modules again is a third of every `lab` command's start)
	@$(PY) -m compileall -q lab

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || $(MAKE) --no-print-directory python-venv
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps --editable .
	touch $@

test: venv test-host ## run every test, on two pytest workers (WORKERS=N: on N; 1: one at a time) (installs what the Docker and sshd tiers need, as root on Debian)
	$(PYTEST)

test-host:
	@tests/setup-host.sh

lint: venv ## ruff and mypy (the settings are in pyproject.toml)
	$(PY) -m ruff check lab tests benchmarks docs
	$(PY) -m mypy

docs: venv ## regenerate docs/reference.md from the parser (a test fails when it is stale)
	$(PY) -m docs.reference

test-unit: venv ## run the fast tests only (no processes, sshd or Docker)
	$(PYTEST) -m "not local and not sshd and not docker and not machines"

bench: venv test-host ## time the lab against its baselines, as ratios (benchmarks/lab_speed.py; BENCH=name..., REPEAT=3)
	$(PY) benchmarks/lab_speed.py $(BENCH) --repeat $(REPEAT)

run: venv ## run every exercise on the local cluster (NPROC=4 ranks, LAUNCHER=lab|torchrun|spawn)
	$(PY) -m lab run all --nproc $(NPROC) --launcher $(LAUNCHER)

lab-up: venv ## build the image, start the 4-host lab NAME (TOPOLOGY=plain|cross-vpc, SCHEDULER=none|slurm), write its inventory, smoke-test it
	$(PY) -m lab up --name $(NAME) --topology $(TOPOLOGY) --scheduler $(SCHEDULER) $(LAB_UP_ARGS)

lab-down: venv ## remove every container, network and volume of the lab NAME (default lab)
	$(PY) -m lab down --name $(NAME)

lab-status: venv ## show each host of the lab NAME, its addresses and whether sshd answers
	$(PY) -m lab status --name $(NAME)

list: venv ## list the exercises
	$(PY) -m lab list

python-venv:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "lab: installing python3-venv from Debian"; \
	  apt-get update -qq && apt-get install -y -qq python3-venv; \
	else echo "lab: $(PYTHON) cannot make a virtualenv; install venv (Debian: sudo apt-get install python3-venv)"; exit 1; fi

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
