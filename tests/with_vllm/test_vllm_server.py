"""A real `vllm serve` with ngramspec as its drafter, queried over HTTP with the openai client
(CPU, loopback only): its greedy chat answers, asked all at once, equal those of the same engine
without speculation (vLLM's offline chat on the plain engine the exactness tests start: the
same chat template and settings a plain server applies).

The server is the one the exactness tests query (vllm_helpers.engine_outputs): one start serves
both."""

from __future__ import annotations

from vllm_helpers import chat_questions, engine_outputs


def test_server_answers_equal_the_engine_without_speculation():
    plain, served = engine_outputs(speculative=False), engine_outputs(speculative=True)
    assert "ngramspec.vllm.Proposer" in served["log"]
    assert served["chat_accepted"] > 20, "the server ran, but no draft was accepted"
    assert all(plain["chat"]) and len(plain["chat"]) == len(chat_questions())
    assert served["chat"] == plain["chat"]
