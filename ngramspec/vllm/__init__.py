"""Layer 3, vllm: ngramspec as vLLM's ``custom_class`` drafter, ``ngramspec.vllm.Proposer``.

Owns the proposer (``proposer``: the adapter, its stats file and its back-off after failures),
rows of vLLM's batch mapped to session slots with their spot checks (``rows``), one engine
step's drafting in one compiled call (``kernels``) and the settings read from the environment
with the step-cost prior (``settings``).

May import: draft, cost, util; numpy and numba. Never hf, torch or transformers (importing it
never touches transformers' ``generate``), nor app. Re-exported here: :class:`Proposer` (the
path vLLM configs name) and the settings' environment variables and prior.
"""

from .proposer import Proposer
from .settings import COST_FILE_ENV, HISTORY_TOKENS, SETTINGS_ENV, STATS_FILE_ENV, VLLM_CPU_PRIOR

__all__ = ["COST_FILE_ENV", "HISTORY_TOKENS", "SETTINGS_ENV", "STATS_FILE_ENV", "VLLM_CPU_PRIOR", "Proposer"]
