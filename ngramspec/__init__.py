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

import importlib

# The public names, imported on first use (PEP 562): `import ngramspec` and the command's usage
# errors stay quick, without loading torch and transformers before they are needed.
_WHERE = {
    "SpeculatorConfig": ".draft.config", "DecodeStats": ".draft.metrics", "Draft": ".draft.proposal",
    "SpeculationSession": ".draft.session", "NgramSpeculator": ".draft.speculator",
    "UnsupportedGenerationError": ".hf.checks", "install": ".hf.hook", "ngram_generate": ".hf.hook",
    "uninstall": ".hf.hook", "ModelNotFoundError": ".hf.models", "load_model": ".hf.models",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))


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
