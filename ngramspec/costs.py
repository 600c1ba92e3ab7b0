"""The verify-cost curve of a model on its device: measured once, cached, re-measured when stale.

    spec = NgramSpeculator.for_model(model)     # measures (~10-30 s) or loads the cached curve

Draft sizing needs cost(q): one forward over q new tokens relative to one token. It depends on
the model, the device, the dtype, the torch version and (on CPU) the thread count: a 2-core CPU
pays ~1.4-1.9x for 2-16 tokens, a data-centre GPU nearly nothing until its matrix units fill.
The curve is cached under ``cache_dir()/costs`` keyed by all of these, and measured again when
older than ``max_age_days`` or when any key part changed.
"""

from __future__ import annotations

import hashlib
import json
import platform
import statistics
import time

import torch

QS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128)


def measure_cost_curve(model, context: int = 400, qs=QS, repeats: int = 9) -> dict[int, float]:
    """Median time of a forward over q random tokens on top of ``context`` cached tokens,
    relative to q = 1, interleaving all q so drift hits them alike. Returns {q: ratio} plus
    {0: seconds of one one-token forward}."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    cache = DynamicCache(config=model.config)
    times: dict[int, list[float]] = {q: [] for q in qs}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        model(input_ids=torch.randint(0, vocab, (1, context), device=device), cache=cache, logits_to_keep=1)
        for rep in range(repeats + 2):
            for q in qs:
                ids = torch.randint(0, vocab, (1, q), device=device)
                sync()
                start = time.perf_counter()
                model(input_ids=ids, cache=cache, logits_to_keep=q).logits.argmax(-1).tolist()
                elapsed = time.perf_counter() - start
                cache.crop(-q)
                if rep >= 2:  # the first two rounds warm up kernels and allocators
                    times[q].append(elapsed)
    base = statistics.median(times[1])
    curve = {q: statistics.median(t) / base for q, t in times.items()}
    curve[1] = 1.0
    return curve | {0: base}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.machine()} {platform.processor() or 'cpu'} x{torch.get_num_threads()} threads"


def cost_key(model) -> dict:
    parameter = next(model.parameters())
    return {
        "model": str(getattr(model.config, "_name_or_path", "") or type(model).__name__),
        "layers": getattr(model.config, "num_hidden_layers", None),
        "hidden": getattr(model.config, "hidden_size", None),
        "device": device_name(parameter.device),
        "dtype": str(parameter.dtype),
        "torch": torch.__version__,
    }


def cached_cost_curve(model, max_age_days: float = 30.0, refresh: bool = False) -> tuple:
    """``((q, cost), ...)`` for ``SpeculatorConfig.verify_cost``: from the cache when fresh,
    else measured now and cached."""
    from .models import cache_dir

    key = cost_key(model)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    path = cache_dir() / "costs" / f"{digest}.json"
    if path.is_file() and not refresh:
        try:
            saved = json.loads(path.read_text())
            if saved.get("key") == key and time.time() - saved["measured_at"] < max_age_days * 86400:
                return tuple((int(q), float(c)) for q, c in saved["curve"])
        except (ValueError, KeyError, OSError):
            pass  # unreadable: measure again
    curve = measure_cost_curve(model)
    base = curve.pop(0)
    points = tuple(sorted((int(q), round(float(c), 3)) for q, c in curve.items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps({"key": key, "measured_at": time.time(), "one_token_seconds": base,
                                "curve": points}, indent=1))
    temp.replace(path)
    return points
