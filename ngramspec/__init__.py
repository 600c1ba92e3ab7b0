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
"""

from .draft.config import SpeculatorConfig
from .draft.metrics import DecodeStats
from .draft.proposal import Draft
from .draft.session import SpeculationSession
from .draft.speculator import NgramSpeculator
from .hf.checks import UnsupportedGenerationError
from .hf.hook import install, ngram_generate, uninstall
from .hf.models import ModelNotFoundError, load_model

__version__ = "0.1.0"  # the only place the version is declared: pyproject.toml reads it

__all__ = [
    "DecodeStats",
    "Draft",
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
