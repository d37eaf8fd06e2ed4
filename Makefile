# Two commands do all the set-up on a fresh machine:
#   make demo   creates .venv, installs convoy, and runs its main job on whatever this machine has
#   make test   creates .venv if needed, installs convoy, and runs the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch is pinned to the local CPU build and installed first, so that nothing pulls a CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: demo test venv bench clean

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

bench: venv
	$(BIN)/python benchmarks/cli_latency.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
