"""Host-device waits per decode step, counted on CPU.

On an accelerator the host waits for the device whenever it reads a device value (``.tolist()``,
``.item()``, ``bool(t)``), whenever a result's size or value is read from the device (boolean-mask
indexing ``t[mask]``, ``nonzero`` and its kin, ``torch.equal``, ``torch.where(condition)``),
whenever it waits explicitly (``torch.cuda.synchronize()``, ``Event.synchronize()``,
``Stream.synchronize()``) and whenever it uploads host values with a blocking copy
(``.to(device)``, ``torch.tensor(..., device=)``, ``t[i] = host_tensor``). A decode step must wait
exactly once: when it reads the target's choices. :class:`DeviceWaits` counts both kinds, done
by the package's own code (transformers' are plain generate()'s too), on the path an
accelerator takes (every draft position decided at once: ``reads_all_positions_at_once``,
forced here). Tensors the package creates on the host (no device named: the uniforms' CPU
generators, a streamer's tokens) are host values: reading them costs no wait. The CUDA twin of
these checks is tests/test_cuda.py (torch's sync debug mode).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import ngramspec
from ngramspec import NgramSpeculator
from ngramspec.hf import verify
from ngramspec.hf.target import left_pad

from conftest import plain_generate
from test_batch import PAD, repetitive_rows
from test_exact_tiny import random_prompt

PACKAGE = str(Path(ngramspec.__file__).resolve().parent)
FLAT = ((1, 1.0), (512, 1.0))  # drafting always pays: every step verifies a draft
READS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__", "__array__")


def _caller() -> str | None:
    """'file:line' of the code that called the patched method, when it is the package's."""
    frame = sys._getframe(2)
    name = frame.f_code.co_filename
    return f"{Path(name).name}:{frame.f_lineno}" if name.startswith(PACKAGE) else None


class DeviceWaits:
    """Counts the host's waits for the device (module doc) done by package code while active;
    ``where`` lists each one as 'file:line what'."""

    def __init__(self, monkeypatch):
        self.where: list[str] = []
        self.outputs: list = []  # what each counted generate() returned
        for name in READS:
            self._patch_read(monkeypatch, name)
        original_to, original_setitem = torch.Tensor.to, torch.Tensor.__setitem__

        def to(tensor, *args, **kwargs):
            result = original_to(tensor, *args, **kwargs)
            at = _caller()
            if at is None:  # not the package's call (and maybe with arguments _parse_to does not take)
                return result
            device, _, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
            if device is not None and _is_host(tensor):
                if not non_blocking:
                    self.wait(at, "blocking upload .to(device)")
                if result is tensor:  # on CPU the "upload" is the tensor itself: now a device value
                    result = tensor.view_as(tensor)
            return result

        def setitem(tensor, index, value):
            at = _caller()
            if at is not None and not _is_host(tensor) and (
                    (torch.is_tensor(value) and _is_host(value) and value.dim() > 0) or isinstance(value, list)):
                self.wait(at, "blocking upload t[...] = host values")
            return original_setitem(tensor, index, value)

        monkeypatch.setattr(torch.Tensor, "to", to)
        monkeypatch.setattr(torch.Tensor, "__setitem__", setitem)
        original_getitem = torch.Tensor.__getitem__

        def getitem(tensor, index):
            at = _caller()
            if at is not None and any(torch.is_tensor(i) and i.dtype == torch.bool and not _is_host(i)
                                      for i in (index if isinstance(index, tuple) else (index,))):
                self.wait(at, "boolean-mask indexing t[mask]")  # the result's size is read from the device
            return original_getitem(tensor, index)

        monkeypatch.setattr(torch.Tensor, "__getitem__", getitem)
        # Functions whose result's size or value is read from the device: nonzero and its kin,
        # torch.equal (a Python bool), the single-argument torch.where.
        for name in ("nonzero", "argwhere", "masked_select", "unique", "equal"):
            self._patch_function(monkeypatch, torch, name, f"torch.{name}()")
        self._patch_function(monkeypatch, torch, "where", "torch.where(condition)",
                             only=lambda args, kwargs: len(args) + len(kwargs) == 1)
        for name in ("equal", "masked_select", "unique", "argwhere"):
            self._patch_read(monkeypatch, name)
        # Explicit waits: the whole device, a stream, an event (counted without a device).
        for owner, what in ((torch.cuda, "torch.cuda.synchronize()"), (torch.cuda.Event, "Event.synchronize()"),
                            (torch.cuda.Stream, "Stream.synchronize()")):
            self._patch_wait(monkeypatch, owner, what)
        for factory in ("tensor", "as_tensor", "rand", "randint", "randn", "from_numpy"):
            self._patch_factory(monkeypatch, factory)

    def wait(self, at: str, what: str) -> None:
        self.where.append(f"{at} {what}")

    def _patch_read(self, monkeypatch, name):
        original = getattr(torch.Tensor, name)

        def read(tensor, *args, **kwargs):
            at = _caller()
            if at is not None and not _is_host(tensor):
                self.wait(at, f".{name}()")
            return original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read)

    def _patch_wait(self, monkeypatch, owner, what):
        original = owner.synchronize

        def synchronize(*args, **kwargs):
            at = _caller()
            if at is not None:
                self.wait(at, what)
                return None  # counted; on a machine without CUDA there is nothing to wait for
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, "synchronize", synchronize)

    def _patch_function(self, monkeypatch, module, name, what, only=lambda args, kwargs: True):
        original = getattr(module, name)

        def call(*args, **kwargs):
            at = _caller()
            tensors = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]
            if at is not None and only(args, kwargs) and any(not _is_host(t) for t in tensors):
                self.wait(at, what)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, call)

    def _patch_factory(self, monkeypatch, name):
        original = getattr(torch, name)

        def make(*args, **kwargs):
            tensor = original(*args, **kwargs)
            at = _caller()
            if at is not None:
                if kwargs.get("device") is None:
                    tensor._on_host = True  # created on the host: reading it costs no wait
                elif name in ("tensor", "as_tensor", "from_numpy"):
                    self.wait(at, f"blocking upload torch.{name}(..., device=)")
            return tensor

        monkeypatch.setattr(torch, name, make)


def _is_host(tensor) -> bool:
    return getattr(tensor, "_on_host", False)


PLANTED_WAITS = {  # code the package might run -> what the counter must report
    "t[t > 0]": "boolean-mask indexing t[mask]",
    "t[:, None][t > 0, 0]": "boolean-mask indexing t[mask]",
    "torch.nonzero(t > 0)": "torch.nonzero()",
    "(t > 0).nonzero()": ".nonzero()",
    "torch.argwhere(t > 0)": "torch.argwhere()",
    "torch.where(t > 0)": "torch.where(condition)",
    "torch.masked_select(t, t > 0)": "torch.masked_select()",
    "torch.equal(t, t)": "torch.equal()",
    "t.equal(t)": ".equal()",
    "torch.unique(t)": "torch.unique()",
    "torch.cuda.synchronize()": "torch.cuda.synchronize()",
    "torch.cuda.Event.synchronize(event)": "Event.synchronize()",
    "torch.cuda.Stream.synchronize(event)": "Stream.synchronize()",
    "t.tolist()": ".tolist()",
    "bool(t[0])": ".__bool__()",
}


@pytest.mark.parametrize("code", list(PLANTED_WAITS))
def test_the_counter_sees_every_kind_of_wait(monkeypatch, code):
    """The counter itself: each kind of wait, planted in code that runs as the package's (compiled
    under a package file's name), is reported once; the same code run outside the package is not."""
    scope = {"torch": torch, "event": object()}
    exec(compile(f"def plant(t):\n    return {code}\n", f"{PACKAGE}/hf/decode.py", "exec"), scope)
    exec(f"def outside(t):\n    return {code}\n", scope)
    waits = DeviceWaits(monkeypatch)
    scope["plant"](torch.tensor([-1.0, 2.0, 3.0]))  # made here, outside the package: a device value
    assert [w.split(" ", 1)[1] for w in waits.where] == [PLANTED_WAITS[code]], waits.where
    waits.where.clear()
    if "synchronize" not in code:  # outside the package it is the real call: without CUDA it raises
        scope["outside"](torch.tensor([-1.0, 2.0, 3.0]))
    assert waits.where == [], "code outside the package counted"


def waits_per_forward(model, waits: DeviceWaits, **kwargs) -> tuple[list[list[str]], NgramSpeculator]:
    """generate() counted by ``waits``; per forward (the prefill first), the waits from its start
    to the next forward's (the last: to generate()'s return)."""
    starts: list[int] = []
    hook = model.register_forward_pre_hook(lambda *args: starts.append(len(waits.where)))
    try:
        waits.outputs.append(model.generate(**kwargs))
    finally:
        hook.remove()
    ends = starts[1:] + [len(waits.where)]
    return [waits.where[s:e] for s, e in zip(starts, ends)], kwargs["ngram_speculator"]


@pytest.fixture()
def accelerator_path(monkeypatch):
    """Every draft position decided at once, as on an accelerator (module doc)."""
    monkeypatch.setattr(verify, "reads_all_positions_at_once", lambda logits: True)


def _trees_verified(monkeypatch) -> list[bool]:
    """Records, per verify step, whether it was given token trees."""
    trees, original = [], verify.verify_step

    def verify_step(drafts, parents, *args, **kwargs):
        trees.append(parents is not None)
        return original(drafts, parents, *args, **kwargs)

    monkeypatch.setattr(verify, "verify_step", verify_step)
    return trees


SAMPLING = [dict(do_sample=True, temperature=0.7), dict(do_sample=True, top_k=5),
            dict(do_sample=True, top_p=0.9, temperature=0.5), dict(do_sample=True, min_p=0.1, temperature=1.3)]
MODES = {
    "greedy": {},
    **{"sampling " + ",".join(f"{k}={v}" for k, v in s.items() if k != "do_sample"): s for s in SAMPLING},
    "repetition_penalty": dict(repetition_penalty=1.3),
    "sampling+processor": dict(do_sample=True, top_k=8, repetition_penalty=1.3),
}


@pytest.mark.parametrize("layout", ["one row", "batch of 3", "tree"])
@pytest.mark.parametrize("mode", list(MODES))
def test_one_device_wait_per_forward(tiny_model, monkeypatch, mode, layout):
    """Every forward, from the prefill on, is followed by exactly one wait for the device (the
    read of its choices): greedy, sampling with each warper, processors; one row, a left-padded
    batch, token trees. (Set-up before the prefill, once per call, is not counted.) The output
    is the one of the CPU path (position by position), and greedy output plain generate()'s."""
    if layout == "batch of 3":
        ids, mask = left_pad(repetitive_rows(np.random.default_rng(4), 3, lengths=(20, 50)), PAD)
        inputs = dict(input_ids=ids, attention_mask=mask)
    else:
        inputs = dict(input_ids=random_prompt(np.random.default_rng(9), tiny_model.config.vocab_size, 40))
    kwargs = dict(max_new_tokens=60, eos_token_id=None, **inputs, **MODES[mode])

    def speculator():
        torch.manual_seed(0)  # the uniforms' seeds: the same draws on both paths
        return NgramSpeculator(min_n=1, verify_cost=FLAT, tree_branches=3 if layout == "tree" else 1)

    expected = tiny_model.generate(ngram_speculator=speculator(), **kwargs)  # the CPU path
    if not kwargs.get("do_sample"):
        plain = {k: v for k, v in kwargs.items() if k != "input_ids"}
        assert expected.tolist() == plain_generate(tiny_model, kwargs["input_ids"], **plain).tolist()
    monkeypatch.setattr(verify, "reads_all_positions_at_once", lambda logits: True)
    trees, waits = _trees_verified(monkeypatch), DeviceWaits(monkeypatch)
    per_forward, spec = waits_per_forward(tiny_model, waits, ngram_speculator=speculator(), **kwargs)
    assert waits.outputs[-1].tolist() == expected.tolist()
    stats = spec.last_stats
    assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0, "no draft verified: the test checks nothing"
    assert layout != "tree" or any(trees), "no token tree was verified"
    extra = [(i, w) for i, w in enumerate(per_forward) if len(w) != 1]
    total = sum(len(w) for w in per_forward)
    assert not extra, (f"{total / len(per_forward):.2f} waits per forward ({total} over {len(per_forward)}); "
                       f"forwards with other than one: {extra[:3]}")


class EmulatedCudaEvents:
    """torch.cuda.Event on CPU: an event completes once the host has waited for the device
    after recording it (as a CUDA event completes by the next sync); ``synchronize`` is a wait."""

    def __init__(self, waits: DeviceWaits):
        self.waits = waits

    def __call__(self, enable_timing: bool = False):
        waits = self.waits

        class Event:
            def record(self, stream=None):
                self.time, self.after = time.perf_counter(), len(waits.where)

            def query(self) -> bool:
                return len(waits.where) > self.after

            def synchronize(self):
                waits.wait("event", ".synchronize()")

            def elapsed_time(self, end) -> float:
                assert self.query() and end.query(), "elapsed_time of an incomplete event"
                return max(end.time - self.time, 1e-6) * 1000

        return Event()


@pytest.mark.parametrize("clock", ["cpu clock", "cuda events (emulated)"])
def test_online_cost_model_times_every_forward_without_a_wait(tiny_model, monkeypatch, accelerator_path, clock):
    """Every timed forward (all but the prefill) reaches the cost model, and timing adds no wait:
    each forward is followed by one wait, as with a fixed cost curve (no timer)."""
    from ngramspec.cost import timer
    from ngramspec.hf import hook

    ids = random_prompt(np.random.default_rng(9), tiny_model.config.vocab_size, 40)
    common = dict(input_ids=ids, max_new_tokens=80, eos_token_id=None)
    waits = DeviceWaits(monkeypatch)
    fixed, _ = waits_per_forward(tiny_model, waits, ngram_speculator=NgramSpeculator(min_n=1, verify_cost=FLAT),
                                 **common)
    if clock != "cpu clock":
        monkeypatch.setattr(torch.cuda, "Event", EmulatedCudaEvents(waits))
        monkeypatch.setattr(hook, "ForwardTimer", lambda cost, _: timer.ForwardTimer(cost, torch.device("cuda")))
    spec = NgramSpeculator(min_n=1)  # verify_cost=None: the online cost model
    online, spec = waits_per_forward(tiny_model, waits, ngram_speculator=spec, **common)
    assert spec.last_stats.target_forwards == len(online) > 10
    assert spec.cost_model.observations == len(online) - 1, "a timed forward never reached the cost model"
    assert [len(w) for w in fixed] == [1] * len(fixed)
    assert [len(w) for w in online] == [1] * len(online), f"timing added waits: {[w for w in online if len(w) != 1]}"


@pytest.mark.parametrize("extra", [{}, dict(do_sample=True, top_k=5, repetition_penalty=1.3)])
@pytest.mark.parametrize("branches", [1, 3])
def test_the_cuda_sync_rule_holds_on_the_emulated_device(tiny_model, monkeypatch, extra, branches):
    """tests/test_cuda.py's rule (one sync between forwards, only the named set-up syncs) run on
    CPU: this counter's waits are raised as the warnings CUDA's sync debug mode gives, so that
    the rule's own bookkeeping (forward windows, whose frame a sync comes from) is checked
    without a GPU."""
    import warnings

    import test_cuda

    monkeypatch.setattr(verify, "reads_all_positions_at_once", lambda logits: True)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    waits = DeviceWaits(monkeypatch)
    count = waits.wait

    def wait(at: str, what: str) -> None:
        count(at, what)
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=2)

    monkeypatch.setattr(waits, "wait", wait)
    prompt = test_cuda.random_prompt

    class OnDevice:  # the prompt's .cuda() gives the CPU tensor
        def __init__(self, *args):
            self.ids = prompt(*args)

        def cuda(self):
            return self.ids

    monkeypatch.setattr(test_cuda, "random_prompt", OnDevice)
    test_cuda.test_one_sync_per_step(tiny_model, extra, branches)
    assert any("verify.py" in w for w in waits.where), "no wait counted: the rule was checked on nothing"
