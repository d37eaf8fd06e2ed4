# Two commands do all the set-up on a fresh machine:
#   make demo   creates .venv, installs convoy, and runs its main job on whatever this machine has
#   make test   creates .venv if needed, installs convoy, checks the code (make lint: ruff, then mypy), and runs
#               the test suite, then the tests that start ranks again as a one-GPU machine would show them to
#               convoy (docs/gpu.md)
#   make test-gpu   on a GPU machine: the gpu-marked tests, then the rest of the suite (8 workers in parallel
#                   when pytest-xdist is installed), with the system python3 (its CUDA torch; nothing is
#                   installed but convoy itself, editable, without dependencies)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch is pinned and installed first. PyPI's torch for Linux is the CUDA build (GBs of nvidia-* wheels): on
# Linux without a working NVIDIA driver the CPU build (2.13.0+cpu) comes from PyTorch's own CPU index
# (https://pytorch.org/get-started/locally/), added beside the configured one for torch alone (--no-deps: its
# dependencies come with convoy's, from the configured index, and an unreachable extra index costs one lookup).
# Elsewhere (a GPU machine, macOS) PyPI's build. Another build: make venv TORCH=torch==2.13.0+rocm6.4 \
#   TORCH_INDEX=https://download.pytorch.org/whl/rocm6.4
NO_GPU       = $(shell [ "$$(uname -s)" = Linux ] && ! nvidia-smi -L >/dev/null 2>&1 && echo yes)
TORCH       ?= torch==2.13.0$(if $(NO_GPU),+cpu)
TORCH_INDEX ?= $(if $(NO_GPU),https://download.pytorch.org/whl/cpu)

.PHONY: demo test lint test-simulated-gpu test-gpu venv bench clean

$(BIN)/convoy: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-deps "$(TORCH)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -e ".[torch,dev,plot]"
	@touch $@

venv: $(BIN)/convoy

demo: venv
	$(BIN)/convoy devices
	$(BIN)/convoy launch examples/classifier.py --epochs 2

test: venv
	@$(MAKE) --no-print-directory lint
	$(BIN)/python -m pytest -q
	@$(MAKE) --no-print-directory test-simulated-gpu

# Style and mistakes (ruff), then types (mypy over src/convoy); both configured in pyproject.toml
lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy

# The tests that start ranks through convoy (tests/launch_sites.py lists them), with convoy seeing one H100
# (an inventory file) and CUDA_VISIBLE_DEVICES exported (the suite scrubs it): what fails only on a GPU box.
SIMULATED_GPU ?= tests/inventories/1xh100.json

test-simulated-gpu: venv
	@tests="$$($(BIN)/python -m tests.launch_sites --tests)" && [ -n "$$tests" ] && \
	echo "simulated one-GPU pass ($(SIMULATED_GPU)): $$(echo "$$tests" | wc -l) tests that start ranks" && \
	CUDA_VISIBLE_DEVICES=0 $(BIN)/python -m pytest -q -p no:cacheprovider --simulate-inventory $(SIMULATED_GPU) $$tests

GPU_PYTHON ?= python3
GPU_WORKERS ?= 8

# The GPU tests one at a time (they share the GPU and time collectives), then the rest of the suite: in
# GPU_WORKERS processes, a file each at a time, when pytest-xdist is installed; else one after the other.
test-gpu:
	$(GPU_PYTHON) -m pip install -q --no-deps --no-build-isolation -e .
	$(GPU_PYTHON) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'test-gpu: torch.cuda.is_available() is False with $(GPU_PYTHON); run it on a GPU machine')"
	$(GPU_PYTHON) -m pytest -q -rs -m gpu
	$(GPU_PYTHON) -m pytest -q -rs -m "not gpu" $$($(GPU_PYTHON) -c "import xdist; print('-n $(GPU_WORKERS) --dist loadfile')" 2>/dev/null)

bench: venv
	$(BIN)/python benchmarks/cli_latency.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
