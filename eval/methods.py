"""Decoding methods compared by the harness, and one timed generate() call per method.

    greedy                       plain model.generate (the baseline every run includes)
    hf-pld                       transformers' prompt lookup, prompt_lookup_num_tokens=10
    ngramspec                    NgramSpeculator() with default settings
    ngramspec:max_n=4,min_n=1    any SpeculatorConfig settings (commas allowed inside values)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ngramspec import NgramSpeculator, SpeculatorConfig

HF_PLD_TOKENS = 10


@dataclass
class Method:
    name: str
    speculator: NgramSpeculator | None = None  # set for ngramspec methods


def parse_method(text: str) -> Method:
    text = text.strip()
    if text in ("greedy", "hf-pld"):
        return Method(text)
    if text == "ngramspec" or text.startswith("ngramspec:"):
        config = SpeculatorConfig.from_overrides(text.partition(":")[2])
        return Method(text, NgramSpeculator(config))
    raise ValueError(f"unknown method {text!r}: use greedy, hf-pld, ngramspec or ngramspec:name=value,...")


def split_methods(text: str) -> list[str]:
    """``greedy,hf-pld,ngramspec:max_n=4,min_n=1`` -> methods; a ``name=value`` part after a
    method with settings (``ngramspec:``, ``vllm-rule:``, ``suffix:``...) belongs to it
    (settings are comma-separated too)."""
    methods: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if methods and ":" in methods[-1] and "=" in part and ":" not in part.split("=")[0]:
            methods[-1] += "," + part
        elif methods and methods[-1].startswith("ngramspec:") and "=" not in part and ":" in part and part[0].isdigit():
            methods[-1] += "," + part  # continuation of a verify_cost=1:1.0,4:1.4 value
        else:
            methods.append(part)
    return methods


def parse_methods(text: str) -> list[Method]:
    """Methods from the command line, greedy first (it is the reference for identity)."""
    names = split_methods(text)
    if len(set(names)) != len(names):
        raise ValueError(f"a method is listed twice in {text!r}")
    methods = [parse_method(n) for n in names]
    if "greedy" not in names:
        methods.insert(0, Method("greedy"))
    return sorted(methods, key=lambda m: m.name != "greedy")


@dataclass
class Generation:
    tokens: list[int]
    seconds: float
    forwards: int
    stats: dict = field(default_factory=dict)  # ngramspec's DecodeStats.as_dict()


class ForwardCounter:
    """Counts forward passes of a model (every method's MAT comes from the same count)."""

    def __init__(self, model):
        self.count = 0
        self._handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, *args):
        self.count += 1


def generate(model, counter: ForwardCounter, input_ids: torch.Tensor, method: Method,
             max_new_tokens: int) -> Generation:
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False)
    if method.name == "hf-pld":
        kwargs["prompt_lookup_num_tokens"] = HF_PLD_TOKENS
    elif method.speculator is not None:
        kwargs["ngram_speculator"] = method.speculator
    counter.count = 0
    start = time.perf_counter()
    out = model.generate(input_ids, **kwargs)
    seconds = time.perf_counter() - start
    stats = method.speculator.last_stats.as_dict() if method.speculator is not None else {}
    return Generation(out[0, input_ids.shape[1] :].tolist(), seconds, counter.count, stats)
