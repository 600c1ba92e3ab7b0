"""Replay with the target in the loop: ``python -m eval replay TRACES --model default --methods ...``.

One teacher-forced forward per trace records, for every position p of prompt + output, what a
decode loop has once p is verified (the prefill verifies the prompt; a verify forward every
token it keeps): the target's final hidden state, as a fixed random projection to ``DIMS``
dimensions in fp16 (unit length), its top probability and its argmax. A drafter proposing the
token at stream position s has verified positions up to s - 2 only: the last emitted token
(s - 1) is the target's own, and its state comes with the next forward. Everything is
deterministic, so the figures repeat to the digit.

Two leads of what the target knows that copy statistics do not (``ngramspec+LEAD[+LEAD]``):

- ``source``: every earlier occurrence of the longest suffix match (up to ``MAX_MATCH``
  tokens) is a candidate copy; the one whose state before it is closest (cosine) to the state
  before the last emitted token is copied (PLD+'s rule, on the projected states).
- ``acceptance``: each drafted position's acceptance is a logistic model over the copy
  statistics' own estimate and the target's features (its top probability and argmax where
  the copied token stood, the state similarity, the last emitted token's probability),
  learned online across requests from every verify's outcome. It starts as the copy
  statistics' estimate, and its estimate feeds the one sizing rule.

Worked example: prompt "x a b c a b d", output so far "... a". Both "a" are candidates for the
next tokens ("b c" or "b d"). If the state before the output's "a" is closer to the state
before the second "a" (cosine 0.9 against 0.4), ``source`` drafts "b d".
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from ngramspec.draft.walk import accepted_length

DIMS = 64  # projected state size: 128 bytes a position in fp16
MAX_MATCH = 8  # longest suffix match compared when listing candidate sources
LEADS = ("source", "acceptance")
REFIT_EVERY = 64  # labelled positions between refits of the acceptance model


class TargetView:
    """Per-position target features of one trace (prompt + output)."""

    def __init__(self, states: np.ndarray, top: np.ndarray, argmax: np.ndarray):
        self.states = states  # (T, DIMS) float16, unit length
        self.top = top  # (T,) float32: the target's top probability predicting position p + 1
        self.argmax = argmax  # (T,) int32: its argmax there


def capture(model, traces: list[dict], cache: Path | None = None, quiet: bool = False) -> list[TargetView]:
    """One forward per trace (float32 logits on the model's device); ``cache`` keeps the result
    in an .npz keyed by the traces' ids and lengths, so a second replay needs no model time."""
    import torch
    from tqdm import tqdm

    key = hashlib.sha256(json.dumps([(t["id"], len(t["prompt_ids"]), len(t["output_ids"])) for t in traces])
                         .encode()).hexdigest()[:16]
    if cache is not None and cache.exists():
        data = np.load(cache)
        if str(data["key"]) == key:
            return [TargetView(data[f"s{i}"], data[f"t{i}"], data[f"a{i}"]) for i in range(len(traces))]
    width = model.config.hidden_size
    projection = torch.from_numpy(np.random.default_rng(0).standard_normal((width, DIMS)).astype(np.float32))
    views = []
    for trace in tqdm(traces, desc="target forwards", unit="trace", disable=quiet):
        ids = torch.tensor([trace["prompt_ids"] + trace["output_ids"]], device=model.device)
        with torch.no_grad():
            out = model(ids, output_hidden_states=True)
        hidden = out.hidden_states[-1][0].float().cpu() @ projection  # (T, DIMS); the final norm's output
        hidden = hidden / hidden.norm(dim=1, keepdim=True).clamp(min=1e-6)
        top, argmax = torch.softmax(out.logits[0].float(), -1).max(-1)
        views.append(TargetView(hidden.half().numpy(), top.cpu().numpy(), argmax.cpu().numpy().astype(np.int32)))
    if cache is not None:
        arrays = {f"{k}{i}": a for i, v in enumerate(views)
                  for k, a in (("s", v.states), ("t", v.top), ("a", v.argmax))}
        np.savez(cache, key=np.array(key), **arrays)
    return views


def _logit(p):
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


class AcceptanceModel:
    """Logistic model of a drafted token's acceptance (given the one before it was accepted),
    shared across requests. Features: 1, logit(copy estimate), log(1 + depth), depth == 0,
    log(1 + match), copied from the prompt, the target's logit top probability and agreement
    where the copied token stood, state similarity, the last emitted token's logit probability.
    Weights start at the copy estimate's (1 on its logit, 0 elsewhere) and are refit by Newton
    steps on every labelled position so far, every ``REFIT_EVERY`` new ones."""

    WIDTH = 10

    def __init__(self):
        self.weights = np.zeros(self.WIDTH)
        self.weights[1] = 1.0
        self._rows: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        self._new = 0
        self.scored: list[tuple] = []  # (predicted, copy estimate, label, depth, match) per labelled position

    def predict(self, features: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-np.clip(features @ self.weights, -30, 30)))

    def learn(self, features: np.ndarray, labels: np.ndarray, estimates: np.ndarray, match: int) -> None:
        predicted = self.predict(features)
        self.scored += [(p, e, y, d, match) for d, (p, e, y) in enumerate(zip(predicted, estimates, labels))]
        self._rows.append(features)
        self._labels.append(labels)
        self._new += len(labels)
        if self._new >= REFIT_EVERY:
            self._new = 0
            x, y = np.concatenate(self._rows), np.concatenate(self._labels)
            w = self.weights.copy()
            for _ in range(8):
                p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -30, 30)))
                hessian = (x * (p * (1 - p))[:, None]).T @ x + 1e-2 * np.eye(self.WIDTH)
                w -= np.linalg.solve(hessian, x.T @ (p - y) + 1e-2 * (w - self.weights))
            self.weights = w


def reference_session(drafter, prompt_ids):
    """``drafter.start(prompt_ids)`` as the pure-Python reference session (tests/reference_session.py,
    which drafts exactly what the compiled engine does): the leads replace its candidate ranking
    and sizing, which the engine does not expose."""
    tests = str(Path(__file__).resolve().parent.parent / "tests")
    if tests not in sys.path:
        sys.path.append(tests)
    from reference_session import ReferenceSession

    return ReferenceSession(drafter.config, prompt_ids, history=drafter.history, cost_model=drafter.cost_model,
                            pool=drafter.pool)


class TargetAwareSession:
    """A drafting session (``NgramSpeculator.start``) with the chosen leads, over one trace."""

    def __init__(self, session, view: TargetView, leads: tuple[str, ...], model: AcceptanceModel | None):
        self.session, self.view, self.leads, self.model = session, view, leads, model
        self._stream = session.index.tokens  # grows in place as the session extends
        self._pending = None  # (features, estimates, length sent, match) of the last sized draft
        if "source" in leads:
            self._own_candidates = session._candidates
            session._candidates = self._candidates

    def _similarity(self, sources: np.ndarray) -> np.ndarray:
        s = self.session.index.length
        return self.view.states[sources - 2].astype(np.float32) @ self.view.states[s - 2].astype(np.float32)

    def _candidates(self, wanted: int):
        """The session's candidates, with the first replaced by the most similar occurrence of
        the longest suffix match when that match has several."""
        found = self._own_candidates(wanted)
        s, stream = self.session.index.length, self._stream
        if not found or s < 3:
            return found
        starts = np.flatnonzero(stream[: s - 1] == stream[s - 1]) + 1  # after an earlier last token
        starts = starts[starts >= 2]
        if starts.size < 2:
            return found
        match = np.ones(starts.size, dtype=np.int64)
        for back in range(1, MAX_MATCH):
            going = (match == back) & (starts - 1 - back >= 0)
            going[going] = stream[starts[going] - 1 - back] == stream[s - 1 - back]
            match[going] += 1
        longest = np.flatnonzero(match == match.max())
        if longest.size < 2:
            return found
        best = int(starts[longest[np.argmax(self._similarity(starts[longest]))]])
        return [type(found[0])(best, int(match.max()), stream)] + [c for c in found[1:] if c.start != best]

    def _features(self, draft, source_kind: int, match: int) -> np.ndarray:
        s, k, view, stream = self.session.index.length, len(draft), self.view, self._stream
        depth = np.arange(k)
        where = draft.source_start + depth  # stream position of each copied token
        copied = (draft.source_start >= 2) & (where < s)
        copied &= stream[np.clip(where, 0, s - 1)] == draft.tokens
        before = np.clip(where - 1, 0, s - 1)
        similarity = float(self._similarity(np.array([draft.source_start]))[0]) if draft.source_start >= 2 else 0.0
        return np.stack([
            np.ones(k), _logit(draft.acceptance), np.log1p(depth), (depth == 0).astype(float),
            np.full(k, np.log1p(match)), (where < self.session.prompt_length).astype(float),
            np.where(copied, _logit(view.top[before]), 0.0),
            np.where(copied, (view.argmax[before] == draft.tokens).astype(float) - 0.5, 0.0),
            np.full(k, similarity), np.full(k, _logit(view.top[s - 2])),
        ], axis=1)

    def propose(self, max_tokens=None, sized=True, tree=True):
        self._pending = None
        if "acceptance" not in self.leads:
            return self.session.propose(max_tokens, sized, tree)
        draft = self.session.propose(max_tokens, sized=False, tree=False)
        if not len(draft):
            return draft
        _, source_kind, match, _, _ = self.session._pending
        features = self._features(draft, source_kind, match)
        acceptance = self.model.predict(features)
        length = self.session._best_length(source_kind, match, acceptance)
        if length == 0:  # declined, as the session's own sizing would (it has faded the evidence)
            self.session._pending = None
            return type(draft)(draft.tokens[:0], match_len=draft.match_len, source_start=draft.source_start)
        self._pending = (features[:length], draft.acceptance[:length], length, match)
        return type(draft)(draft.tokens[:length], match_len=draft.match_len, source_start=draft.source_start,
                           acceptance=acceptance[:length])

    def extend(self, tokens, verified=None):
        if self._pending is None:
            return self.session.extend(tokens, verified)
        features, estimates, length, match = self._pending
        self._pending = None
        kept = accepted_length(self.session._pending[0][:length], None, np.asarray(tokens, dtype=np.int32))
        labelled = min(kept + 1, length)  # positions verified up to and including the first refused
        if labelled:
            labels = (np.arange(labelled) < kept).astype(float)
            self.model.learn(features[:labelled], labels, estimates[:labelled], match)
        self.session.extend(tokens, verified=length)

    def finish(self):
        finish = getattr(self.session, "finish", None)
        if finish is not None:
            finish()


def parse_method(name: str) -> tuple[str, tuple[str, ...]]:
    """``ngramspec+source+acceptance:settings`` -> ("ngramspec:settings", ("source", "acceptance"))."""
    head, colon, settings = name.partition(":")
    base, *leads = head.split("+")
    unknown = [lead for lead in leads if lead not in LEADS]
    if base != "ngramspec" or unknown:
        raise ValueError(f"unknown target-aware method {name!r}: use ngramspec+LEAD[+LEAD][:settings], "
                         f"LEAD among {', '.join(LEADS)}")
    return base + colon + settings, tuple(leads)


def stratified_auc(scored: list[tuple], column: int) -> float:
    """Ranking AUC of ``column`` of ``scored`` for acceptance, counting only pairs of the same
    depth and match length (capped at 8): what separates drafts the copy statistics score alike."""
    hits = pairs = 0.0
    strata: dict[tuple, list] = {}
    for row in scored:
        strata.setdefault((row[3], min(row[4], 8)), []).append((row[column], row[2]))
    for rows in strata.values():
        score = np.array([r[0] for r in rows])
        label = np.array([r[1] for r in rows]) > 0.5
        if label.all() or not label.any():
            continue
        kept, refused = score[label], np.sort(score[~label])
        below = np.searchsorted(refused, kept, side="left")
        ties = np.searchsorted(refused, kept, side="right") - below
        hits += below.sum() + 0.5 * ties.sum()
        pairs += kept.size * refused.size
    return hits / pairs if pairs else float("nan")


def calibration(scored: list[tuple], column: int, bins: int = 10) -> list[tuple[float, float, int]]:
    """(mean predicted, observed rate, count) per decile of ``column``'s prediction."""
    if not scored:
        return []
    score = np.array([r[column] for r in scored])
    label = np.array([r[2] for r in scored])
    order = np.argsort(score, kind="stable")
    return [(float(score[part].mean()), float(label[part].mean()), int(part.size))
            for part in np.array_split(order, bins) if part.size]


def oracle_shares(results: dict) -> str:
    """Share of the copy oracle's gain, (speed-up - 1) / (oracle's - 1), per drafter and set."""
    oracle = results["oracle"]
    groups = sorted(oracle, key=lambda g: (g == "overall", g))
    lines = ["Share of the oracle's gain, (speed-up - 1) / (oracle speed-up - 1):", "",
             "| drafter | " + " | ".join(groups) + " |", "|---|" + "---|" * len(groups)]
    for name, r in results.items():
        if name != "oracle":
            lines.append(f"| {name} | " + " | ".join(
                f"{(r[g]['speedup'] - 1) / (oracle[g]['speedup'] - 1):.0%}" if g in r and oracle[g]["speedup"] > 1
                else "-" for g in groups) + " |")
    return "\n".join(lines)


def acceptance_report(learned: dict) -> str:
    """Calibration by decile and stratified AUC of each acceptance model beside the copy
    statistics' own estimate, on the positions it sized (scored before learning from them)."""
    lines = []
    for name, model in learned.items():
        if not model.scored:
            continue
        lines += [f"Acceptance of {name}, {len(model.scored)} verified positions, each predicted before its outcome "
                  f"was learned. Ranking AUC within equal depth and match length: learned "
                  f"{stratified_auc(model.scored, 0):.3f}, copy statistics {stratified_auc(model.scored, 1):.3f}.", "",
                  "| decile | learned: predicted | observed | copy statistics: predicted | observed |",
                  "|---|---|---|---|---|"]
        for d, ((p, o, _), (q, r, _)) in enumerate(zip(calibration(model.scored, 0), calibration(model.scored, 1))):
            lines.append(f"| {d + 1} | {p:.2f} | {o:.2f} | {q:.2f} | {r:.2f} |")
        lines += ["", "Final weights: " + ", ".join(f"{w:+.2f}" for w in model.weights), ""]
    return "\n".join(lines)
