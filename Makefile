# Two commands do all the set-up on a fresh machine:
#   make demo   creates .venv, installs convoy, and runs its main job on whatever this machine has
#   make test   creates .venv if needed, installs convoy, and runs the test suite
#   make test-gpu   on a GPU machine: the gpu-marked tests, then the whole suite, with the system python3
#                   (its CUDA torch; nothing is installed but convoy itself, editable, without dependencies)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch is pinned to the local CPU build and installed first, so that nothing pulls a CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: demo test test-gpu venv bench clean

$(BIN)/convoy: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[torch,dev]"
	@touch $@

venv: $(BIN)/convoy

demo: venv
	$(BIN)/convoy devices
	$(BIN)/convoy launch examples/classifier.py --epochs 2

test: venv
	$(BIN)/python -m pytest -q

GPU_PYTHON ?= python3

test-gpu:
	$(GPU_PYTHON) -m pip install -q --no-deps --no-build-isolation -e .
	$(GPU_PYTHON) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'test-gpu: torch.cuda.is_available() is False with $(GPU_PYTHON); run it on a GPU machine')"
	$(GPU_PYTHON) -m pytest -q -m gpu -rs
	$(GPU_PYTHON) -m pytest -q -rs

bench: venv
	$(BIN)/python benchmarks/cli_latency.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
