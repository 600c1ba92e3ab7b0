"""One vocabulary of decoding methods for every command, one parser for method lists, and one
timed generate() call per method (transformers side).

    greedy                       no speculation (vLLM: no speculative_config); the baseline
    hf-pld                       transformers' prompt lookup, prompt_lookup_num_tokens=10 (in
                                 replay: its rule, n=2..1, left-most match, 10 tokens, EOS cut)
    ngram[:min_n=5,max_n=5,k=5]  vLLM's n-gram proposer (its defaults; replay and the simulator
                                 run its rule: longest match, earliest occurrence)
    suffix[:k=24,cached=10000]   SuffixDecoding as vLLM's ``suffix`` runs it (a cache of 10,000
                                 earlier responses; cached=0: none across requests)
    ngramspec[:settings]         NgramSpeculator with SpeculatorConfig settings (commas allowed
                                 inside values: ngramspec:max_n=4,verify_cost=1:1.0,8:1.5)
    oracle[:k=24]                replay only: an upper bound (eval/oracle.py)
    truth-sized[:settings]       replay only: ngramspec's drafts cut to what the target accepts

A list is comma-separated. A part that begins with a name followed by ``:`` or by nothing
starts a method; any other part (``max_n=4``, or ``8:1.5`` continuing a value) belongs to the
settings of the method before it, which are read by ngramspec's own settings parser.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from ngramspec.draft.config import parse_config, split_settings

HF_PLD_TOKENS = 10
# kind -> the settings it takes: a type per name, or None (SpeculatorConfig's own settings)
KINDS = {
    "greedy": {},
    "hf-pld": {},
    "ngram": {"min_n": int, "max_n": int, "k": int},
    "suffix": {"k": int, "depth": int, "factor": float, "min_prob": float, "cached": int},
    "ngramspec": None,
    "oracle": {"k": int},
    "truth-sized": None,
    # replay with the target in the loop (--model; eval/target.py)
    "ngramspec+source": None,
    "ngramspec+acceptance": None,
    "ngramspec+source+acceptance": None,
}
NGRAM_DEFAULTS = {"min_n": 5, "max_n": 5, "k": 5}  # vLLM's when none is given
# Earlier names, for a clear error (results committed before one vocabulary keep them).
RENAMED = {"none": "greedy", "hf-rule": "hf-pld", "vllm-rule": "ngram:min_n=1,max_n=4,k=5",
           "suffix-global": "suffix", "ngram-k10": "ngram:k=10,min_n=2,max_n=5"}
TRANSFORMERS = ("greedy", "hf-pld", "ngramspec")  # run, bench
REPLAY = ("hf-pld", "ngram", "suffix", "ngramspec", "oracle", "truth-sized", "ngramspec+source", "ngramspec+acceptance",
          "ngramspec+source+acceptance")
VLLM = ("greedy", "ngram", "suffix", "ngramspec")  # vllm-bench
SIMULATED = ("greedy", "hf-pld", "ngram", "suffix", "ngramspec")  # vllm-sim
_STARTS_METHOD = re.compile(r"[A-Za-z][\w+-]*(:|$)")


@dataclass(frozen=True)
class MethodSpec:
    """A parsed method: its kind and its settings text, ``name=value`` parts as written (spaces
    around commas dropped; a name given twice: the last one holds, as in SpeculatorConfig)."""

    kind: str
    settings: str = ""

    @property
    def name(self) -> str:
        """The method's text: ``parse_methods(spec.name) == [spec]``; results are labelled by it."""
        return self.kind + (":" + self.settings if self.settings else "")

    @property
    def values(self) -> dict[str, str]:
        """The settings by name, values still text (ngramspec's settings parser)."""
        return split_settings(self.settings)

    def typed(self, defaults: dict | None = None) -> dict:
        """The settings converted to their types, over ``defaults``."""
        return {**(defaults or {}), **{k: KINDS[self.kind][k](v) for k, v in self.values.items()}}

    def __str__(self) -> str:
        return self.name


def _methods_help(allowed) -> str:
    return ", ".join(k + ("" if KINDS[k] == {} else "[:settings]") for k in allowed)


def parse_method(text: str, allowed=tuple(KINDS)) -> MethodSpec:
    kind, colon, rest = text.strip().partition(":")
    kind = kind.strip()
    if kind not in allowed:
        hint = (f"'{kind}' is now named '{RENAMED[kind]}'; " if kind in RENAMED else
                f"'{kind}' is not taken here; " if kind in KINDS else "")
        raise ValueError(f"unknown method {text.strip()!r}: {hint}use {_methods_help(allowed)}")
    rest = ",".join(part.strip() for part in rest.split(",") if part.strip())
    settings = split_settings(rest)
    known = KINDS[kind]
    try:
        if known is None:
            parse_config(rest)  # unknown names and bad values end here
        else:
            for name, value in settings.items():
                if name not in known:
                    raise ValueError(f"unknown setting {name!r}" + (f"; known: {', '.join(known)}" if known else
                                                                    ": it takes none"))
                known[name](value)
    except ValueError as err:
        raise ValueError(f"method {text.strip()!r}: {err}") from None
    return MethodSpec(kind, rest)


def parse_methods(text, allowed=tuple(KINDS)) -> list[MethodSpec]:
    """``greedy,hf-pld,ngramspec:max_n=4,min_n=1`` -> methods (see the module's docstring);
    a list of methods or names passes through the same checks. Listing one twice is refused."""
    if not isinstance(text, str):
        text = ",".join(str(m) for m in text)
    parts: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if _STARTS_METHOD.match(part):
            parts.append(part)
        elif parts and ":" in parts[-1]:
            parts[-1] += "," + part
        else:
            raise ValueError(f"{part!r} in {text!r} is no method and follows no method with settings")
    methods = [parse_method(p, allowed) for p in parts]
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"a method is listed twice in {text!r}")
    return methods


def format_methods(methods) -> str:
    return ",".join(m.name for m in methods)


@dataclass
class Method:
    name: str
    speculator: object | None = None  # an NgramSpeculator for ngramspec methods

    def generate_kwargs(self) -> dict:
        if self.name == "hf-pld":
            return {"prompt_lookup_num_tokens": HF_PLD_TOKENS}
        return {"ngram_speculator": self.speculator} if self.speculator is not None else {}


def make_method(spec: MethodSpec | str) -> Method:
    from ngramspec import NgramSpeculator

    spec = parse_method(spec, TRANSFORMERS) if isinstance(spec, str) else spec
    if spec.kind == "ngramspec":
        return Method(spec.name, NgramSpeculator(parse_config(spec.settings)))
    return Method(spec.name)


def transformers_methods(text) -> list[Method]:
    """Methods for run: greedy first (it is the reference for identity), added when absent."""
    specs = parse_methods(text, TRANSFORMERS)
    methods = [make_method(s) for s in specs]
    if "greedy" not in [m.name for m in methods]:
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


def generate(model, counter: ForwardCounter, input_ids, method: Method, max_new_tokens: int) -> Generation:
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, **method.generate_kwargs())
    counter.count = 0
    start = time.perf_counter()
    out = model.generate(input_ids, **kwargs)
    seconds = time.perf_counter() - start
    stats = method.speculator.last_stats.as_dict() if method.speculator is not None else {}
    return Generation(out[0, input_ids.shape[1] :].tolist(), seconds, counter.count, stats)
