# dflash: `make demo` runs the offline end-to-end job, `make test` the test suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.install-stamp
# CPU machines (no nvidia-smi) keep torch on the CPU build via a constraints file.
CONSTRAINTS := $(if $(shell command -v nvidia-smi 2>/dev/null),,-c constraints/cpu.txt)

.PHONY: install test test-fast demo bench tables clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints/cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(CONSTRAINTS) -e ".[dev]"
	touch $(STAMP)

test: install
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow"

demo: install
	$(PY) -m dflash.demo

bench: install
	$(PY) scripts/bench_forward.py

# Ablation sweeps (sweeps/NAME.yaml): make sweep-depth_cpu; make sweep-depth GPUS=8 SEEDS=0,1,2; ARGS='hydra/launcher=slurm'
sweep-%: install
	$(PY) -m dflash.sweep $* $(if $(GPUS),--gpus $(GPUS)) $(if $(SEEDS),--seeds $(SEEDS)) $(ARGS)

# The paper's tables and figures from artifacts/sweeps (ARGS='source=wandb project=dflash')
tables: install
	$(PY) -m dflash.tables $(ARGS)

clean:
	rm -rf outputs multirun artifacts/demo
