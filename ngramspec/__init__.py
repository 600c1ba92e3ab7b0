"""ngramspec: exact prompt-lookup (n-gram) speculative decoding for transformers.

    import ngramspec
    model, tok = ngramspec.load_model()            # SmolLM2-135M-Instruct, or any causal LM
    spec = ngramspec.NgramSpeculator()
    out = model.generate(input_ids, ngram_speculator=spec, max_new_tokens=256)
    print(spec.last_stats)

Importing the package changes nothing in transformers. :func:`install` (idempotent; called by
:func:`load_model` and by ``DocumentJob``) lets every transformers model's ``generate`` accept
``ngram_speculator=``; calls without it behave exactly as before, and :func:`uninstall` puts
transformers' own ``generate`` back. ``model.generate(ids, custom_generate=ngram_generate,
ngram_speculator=spec)`` needs no install. Nothing in ``ngramspec.vllm`` installs.

The public names load on first use (a module ``__getattr__``), so ``import ngramspec.draft``
(the drafter, as a vLLM worker or the replayer imports it) loads neither torch nor transformers
(``tests/test_layers.py`` checks that in a fresh interpreter), and the command's usage errors
come before torch loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"  # the only place the version is declared: pyproject.toml reads it

# public name -> the module that defines it
_PUBLIC = {
    "DecodeStats": ".draft.metrics",
    "Draft": ".draft.proposal",
    "InexactPrecisionWarning": ".hf.checks",
    "ModelNotFoundError": ".hf.models",
    "NgramSpeculator": ".draft.speculator",
    "SpeculationSession": ".draft.session",
    "SpeculatorConfig": ".draft.config",
    "UnsupportedGenerationError": ".hf.checks",
    "install": ".hf.hook",
    "load_model": ".hf.models",
    "ngram_generate": ".hf.hook",
    "uninstall": ".hf.hook",
}

__all__ = [
    "DecodeStats",
    "Draft",
    "InexactPrecisionWarning",
    "ModelNotFoundError",
    "NgramSpeculator",
    "SpeculationSession",
    "SpeculatorConfig",
    "UnsupportedGenerationError",
    "install",
    "load_model",
    "ngram_generate",
    "uninstall",
]
assert sorted(_PUBLIC) == __all__

if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from .draft.config import SpeculatorConfig
    from .draft.metrics import DecodeStats
    from .draft.proposal import Draft
    from .draft.session import SpeculationSession
    from .draft.speculator import NgramSpeculator
    from .hf.checks import InexactPrecisionWarning, UnsupportedGenerationError
    from .hf.hook import install, ngram_generate, uninstall
    from .hf.models import ModelNotFoundError, load_model


def __getattr__(name: str):
    """Loads a public name's module on first use and keeps the name here."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
