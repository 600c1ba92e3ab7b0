"""Helpers of the vLLM tests (``make test-vllm``, in ``.venv-vllm``): ngramspec as vLLM's
``custom_class`` drafter on the CPU build, against the same engine without speculation.
tests/conftest.py leaves this folder out where vLLM is not installed (the main venv).

Each engine is started once per test run: :func:`engine_outputs` runs every check's requests
on it, shuts it down and keeps the outputs, so the exactness and server tests share one plain
engine and one ngramspec engine."""

from __future__ import annotations

import functools
import gc
import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; the CPU default reserves most of RAM
# vLLM's automatic binding keeps a core back for the front end and leaves the model one OpenMP
# thread on a 2-core machine; binding every core the tests may use made engine steps 1.3-1.6x
# faster here (one request at a time, 30 at once, 600 sampled). Both engines of a comparison
# run with the same binding.
if hasattr(os, "sched_getaffinity"):
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, sorted(os.sched_getaffinity(0)))))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
os.environ.setdefault("VLLM_CPU_CI_ENV", "1")  # the CPU build's test setting: no warm-up pass per engine start

NGRAMSPEC = {"method": "custom_class", "model": "ngramspec.vllm.Proposer", "num_speculative_tokens": 16}

MAX_NUM_SEQS = 64  # every greedy prompt in one batch; 600 samples in 10 waves
MAX_TOKENS = 64  # greedy tokens per prompt
PER_SET = 3  # greedy prompts per shared set, all ten sets, all at once; with ngramspec the first
# of each set also one request at a time
SAMPLES = 600  # sampled continuations per engine
CHAT_SETS = ("xsum", "jfleg", "humanevalfix", "iterater_human", "quixbugs", "asset")  # server questions
CHAT_MAX_TOKENS = 96


def model_dir() -> str:
    from ngramspec.models import default_model_dir

    return str(default_model_dir())


def make_llm(model_dir: str, speculative_config=None, max_num_seqs: int = 16, **kwargs):
    from vllm import LLM

    return LLM(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=4096,
               max_num_seqs=max_num_seqs, speculative_config=speculative_config,
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


@functools.cache
def engine_outputs(speculative: bool) -> dict:
    """One engine, started once per test run (plain, or ngramspec as the drafter), every request
    the tests compare:

    * ``one`` (ngramspec engine only): the first greedy prompt of each set, one request at a
      time ({prompt index: tokens}), compared with the plain engine's ``batch`` outputs;
    * ``batch``: all greedy prompts at once (one batch of 30);
    * ``sampled``: SAMPLES sampled continuations of a rewriting answer already under way (the
      prompt plus the first greedy tokens of its answer), where the answer copies its source
      and drafts get accepted;
    * ``chat`` (plain engine only): the server test's questions answered offline, the reference
      for a ``vllm serve`` with ngramspec.

    The engine is shut down before returning: two engines in one small machine would compete
    for its cores and memory."""
    from vllm import SamplingParams

    import tasks

    prompts = greedy_prompts()
    llm = make_llm(model_dir(), NGRAMSPEC if speculative else None, max_num_seqs=MAX_NUM_SEQS)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    ids = lambda outputs: [list(o.outputs[0].token_ids) for o in outputs]
    one_at_a_time = {i: ids(llm.generate([{"prompt_token_ids": prompts[i]}], greedy, use_tqdm=False))[0]
                     for i in range(0, len(prompts), PER_SET) if speculative}
    at_once = ids(llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False))
    before = spec_counters(llm)
    rewriting = list(tasks.TASKS).index("jfleg") * PER_SET
    prompt = prompts[rewriting] + at_once[rewriting][:6]
    sampled = ids(llm.generate(
        [{"prompt_token_ids": prompt}] * SAMPLES,
        [SamplingParams(temperature=0.7, top_p=0.9, max_tokens=4, seed=1000 + i) for i in range(SAMPLES)],
        use_tqdm=False,
    ))
    after = spec_counters(llm)
    chat = None if speculative else [o.outputs[0].text for o in llm.chat(chat_questions(), chat_params(),
                                                                          use_tqdm=False)]
    del llm
    gc.collect()
    return {"one": one_at_a_time, "batch": at_once, "sampled": sampled, "chat": chat,
            "greedy_accepted": before["accepted_tokens"],
            "sampled_accepted": after["accepted_tokens"] - before["accepted_tokens"]}
