"""ngramspec as a transformers ``custom_generate`` method: exact prompt-lookup (n-gram)
speculative decoding, loaded by transformers itself, with no ``ngramspec.install()``.

    model.generate(input_ids, custom_generate="<this repository, or its folder>", trust_remote_code=True,
                   max_new_tokens=256)                              # default NgramSpeculator()
    model.generate(..., custom_generate=..., trust_remote_code=True, ngram_speculator=spec)

transformers (5.x) loads this file from a Hub repository or a local folder that holds
``custom_generate/generate.py`` and calls :func:`generate` with every argument given to
``model.generate``. Greedy output is token-identical to plain greedy decoding, sampling draws from
exactly the model's distribution; ``ngram_speculator.last_stats`` describes the call.
Needs the ``ngramspec`` package (``custom_generate/requirements.txt``).
"""

from ngramspec.hf.hook import speculative_generate


def generate(model, *args, ngram_speculator=None, **kwargs):
    """``model.generate(...)`` with n-gram speculation (a default ``NgramSpeculator()`` when
    ``ngram_speculator`` is not given)."""
    return speculative_generate(model, *args, ngram_speculator=ngram_speculator, **kwargs)
