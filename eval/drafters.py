"""Reference drafters for replay: the published rules of other systems, as sessions with the
same ``propose(max_tokens)`` / ``extend(tokens)`` API as ngramspec's, so every policy is
judged on the same traces. Plain Python on purpose: these are references, not fast paths.

- transformers' prompt lookup (``PromptLookupCandidateGenerator``): n from 2 down to 1; scan
  the whole sequence left to right; the LEFT-MOST match whose continuation is non-empty wins;
  propose up to 10 tokens, never past the end of the text; drop candidates from the first EOS.
- vLLM's n-gram proposer (``ngram``): the LONGEST suffix match with n in [min_n, max_n], at its
  EARLIEST occurrence; propose up to k tokens, never past the end of the text (vLLM's defaults:
  n=5 only, k=5).
- SuffixDecoding (arctic-inference, vLLM's ``suffix`` method), driven exactly as vLLM 0.32
  drives it, with its defaults there: tree depth 24, up to k=24 tokens, spec factor 1.0, min
  token probability 0.1, and vLLM's cache of 10,000 earlier responses, shared by the traces
  replayed in order (``suffix:cached=0`` keeps none across requests). Needs arctic-inference
  (``make setup-vllm`` builds it into .venv-vllm).
"""

from __future__ import annotations

import numpy as np


class HFPromptLookupSession:
    def __init__(self, prompt_ids, max_ngram: int = 2, num_tokens: int = 10, eos_token_ids=()):
        self.tokens = [int(t) for t in prompt_ids]
        self.max_ngram, self.num_tokens, self.eos = max_ngram, num_tokens, set(eos_token_ids)

    def propose(self, max_tokens: int | None = None) -> np.ndarray:
        tokens, length = self.tokens, len(self.tokens)
        limit = self.num_tokens if max_tokens is None else min(self.num_tokens, max_tokens)
        for n in range(min(self.max_ngram, length - 1), 0, -1):
            suffix = tokens[length - n :]
            for start in range(0, length - n + 1):
                if tokens[start : start + n] == suffix:
                    begin, end = start + n, min(start + n + limit, length)
                    if begin < end:
                        draft = tokens[begin:end]
                        for i, t in enumerate(draft):
                            if t in self.eos:
                                draft = draft[:i]
                                break
                        return np.array(draft, dtype=np.int32)
        return np.zeros(0, dtype=np.int32)

    def extend(self, accepted_tokens) -> None:
        self.tokens.extend(int(t) for t in accepted_tokens)


class VLLMNgramSession:
    def __init__(self, prompt_ids, min_n: int = 5, max_n: int = 5, k: int = 5):
        self.tokens = [int(t) for t in prompt_ids]
        self.min_n, self.max_n, self.k = min_n, max_n, k

    def propose(self, max_tokens: int | None = None) -> np.ndarray:
        tokens, length = self.tokens, len(self.tokens)
        limit = self.k if max_tokens is None else min(self.k, max_tokens)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = tokens[length - n :]
            for start in range(0, length - n):  # earlier occurrences only (not the suffix itself)
                if tokens[start : start + n] == suffix:
                    return np.array(tokens[start + n : min(start + n + limit, length)], dtype=np.int32)
        return np.zeros(0, dtype=np.int32)

    def extend(self, accepted_tokens) -> None:
        self.tokens.extend(int(t) for t in accepted_tokens)


class SuffixDecodingDrafter:
    """``start(prompt_ids)`` factory over one SuffixDecodingCache (the peer, not vendored)."""

    def __init__(self, k: int = 24, depth: int = 24, factor: float = 1.0, min_prob: float = 0.1,
                 cached: int = 10000):
        try:
            from arctic_inference.suffix_decoding import SuffixDecodingCache
        except ImportError as err:
            raise ImportError("the suffix drafters need arctic-inference: run `make setup-vllm` and use "
                              ".venv-vllm/bin/python") from err
        self.cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=cached)
        self.k, self.depth, self.factor, self.min_prob = k, depth, factor, min_prob
        self.requests = 0

    def start(self, prompt_ids, capacity: int = 0):
        self.requests += 1
        return _SuffixSession(self, f"r{self.requests}", prompt_ids)


class _SuffixSession:
    def __init__(self, drafter: SuffixDecodingDrafter, request: str, prompt_ids):
        self.drafter, self.request = drafter, request
        self.tokens = [int(t) for t in prompt_ids]
        drafter.cache.start_request(request, np.asarray(self.tokens, dtype=np.int32))

    def propose(self, max_tokens: int | None = None):
        d = self.drafter
        limit = d.k if max_tokens is None else min(d.k, max_tokens)
        if limit <= 0:
            return _Tokens(np.zeros(0, dtype=np.int32))
        pattern = np.asarray(self.tokens[-d.depth:], dtype=np.int32)
        draft = d.cache.speculate(self.request, pattern, max_spec_tokens=limit, max_spec_factor=d.factor,
                                  min_token_prob=d.min_prob)
        return _Tokens(np.asarray(draft.token_ids, dtype=np.int32))

    def extend(self, accepted_tokens) -> None:
        tokens = [int(t) for t in accepted_tokens]
        self.tokens.extend(tokens)
        self.drafter.cache.add_active_response(self.request, tokens)

    def finish(self) -> None:
        self.drafter.cache.stop_request(self.request)


class ReferenceDrafter:
    """``start(prompt_ids)`` factory, like NgramSpeculator, for a reference rule."""

    def __init__(self, session_class, **settings):
        self.session_class, self.settings = session_class, settings

    def start(self, prompt_ids, capacity: int = 0):
        return _DraftAdapter(self.session_class(prompt_ids, **self.settings))


class _DraftAdapter:
    """Wraps a reference session so propose() returns an object with ``.tokens`` and len()."""

    def __init__(self, session):
        self.session = session

    def propose(self, max_tokens: int | None = None):
        return _Tokens(self.session.propose(max_tokens))

    def extend(self, accepted_tokens) -> None:
        self.session.extend(accepted_tokens)


class _Tokens:
    parents = None  # reference rules draft chains

    def __init__(self, tokens: np.ndarray):
        self.tokens = tokens

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def make_drafter(method, eos_token_ids=(), base=None):
    """A ``start(prompt_ids)`` factory for a replay method (eval/methods.py, text or parsed):
    ``hf-pld``, ``ngram[:min_n=5,max_n=5,k=5]``, ``suffix[:k=24,cached=10000,...]``,
    ``ngramspec[:settings]`` (its settings over ``base``, a SpeculatorConfig; default: the
    defaults)."""
    from ngramspec import NgramSpeculator
    from ngramspec.draft.config import parse_config

    from .methods import NGRAM_DEFAULTS, parse_method

    spec = parse_method(method, ("hf-pld", "ngram", "suffix", "ngramspec")) if isinstance(method, str) else method
    if spec.kind == "hf-pld":
        return ReferenceDrafter(HFPromptLookupSession, eos_token_ids=tuple(eos_token_ids))
    if spec.kind == "ngram":
        return ReferenceDrafter(VLLMNgramSession, **spec.typed(NGRAM_DEFAULTS))
    if spec.kind == "suffix":
        return SuffixDecodingDrafter(**spec.typed())
    return NgramSpeculator(parse_config(spec.settings, base))
