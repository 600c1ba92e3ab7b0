"""A recording ngramspec drafter for tests/with_vllm/test_vllm_drafts.py: vLLM builds it through
its public ``custom_class`` plug-in point (``"model": "vllm_recorder.RecordingProposer"``), in
the engine's own process, and it appends every step's inputs and what ngramspec returned to the
file named by ``NGRAMSPEC_TEST_RECORD`` (pickles, one per step). Nothing of vLLM is patched."""

from __future__ import annotations

import os
import pickle

from ngramspec.vllm import Proposer

RECORD_ENV = "NGRAMSPEC_TEST_RECORD"


class RecordingProposer(Proposer):
    """:class:`ngramspec.vllm.Proposer`, each step also recorded: every row's text
    (``token_ids_cpu[i, :num_tokens_no_spec[i]]``), the tokens it emitted this step, and the
    object ``propose`` returned, as vLLM receives it."""

    def __init__(self, vllm_config, *args, **kwargs):
        super().__init__(vllm_config, *args, **kwargs)
        self._record = open(os.environ[RECORD_ENV], "ab")  # noqa: SIM115 (open for the engine's life)
        pickle.dump({"max_draft": self.max_draft, "max_model_len": self.max_model_len,
                     "vocab_size": int(vllm_config.model_config.get_vocab_size()),
                     "draft_probs_hook": hasattr(self, "take_last_draft_probs")}, self._record)
        self._record.flush()

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, *args, **kwargs):
        drafts = super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, *args, **kwargs)
        rows = len(sampled_token_ids)
        ends = [int(n) for n in num_tokens_no_spec[:rows]]
        pickle.dump({"texts": [token_ids_cpu[i, : ends[i]].tolist() for i in range(rows)],
                     "sampled": [list(map(int, s)) for s in sampled_token_ids],
                     "returned": drafts}, self._record)
        self._record.flush()
        return drafts
