"""A real `vllm serve` with ngramspec as its drafter, queried over HTTP with the openai client
(CPU, loopback only): its greedy chat answers, asked all at once, equal those of the same engine
without speculation (vLLM's offline chat on the plain engine the exactness tests start: the
same chat template and settings a plain server applies)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from vllm_helpers import CHAT_MAX_TOKENS, NGRAMSPEC, chat_questions, engine_outputs
from vllm_helpers import model_dir as default_model_folder

STARTUP_SECONDS = 240


@pytest.fixture(scope="module")
def model_dir():
    return default_model_folder()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def vllm_server(model_dir: str, log: Path, speculative_config=None):
    """`vllm serve` on 127.0.0.1, yielding an openai client once /health answers."""
    import urllib.request

    import openai

    port = free_port()
    command = [str(Path(sys.executable).with_name("vllm")), "serve", model_dir, "--host", "127.0.0.1",
               "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "4096",
               "--max-num-seqs", "8", "--served-model-name", "default"]
    if speculative_config:
        command += ["--speculative-config", json.dumps(speculative_config)]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"))
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + STARTUP_SECONDS
            while True:
                if server.poll() is not None:
                    pytest.fail(f"vllm serve exited with {server.returncode}:\n{log.read_text()[-3000:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                        if reply.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"vllm serve not healthy after {STARTUP_SECONDS} s:\n{log.read_text()[-3000:]}")
                time.sleep(1)
            yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=300)
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def ask_all(client) -> list[str]:
    """Every question at once (a batch on the server), answers in question order."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(messages):
        reply = client.chat.completions.create(model="default", messages=messages, temperature=0,
                                               max_tokens=CHAT_MAX_TOKENS, seed=0)
        return reply.choices[0].message.content

    questions = chat_questions()
    with ThreadPoolExecutor(len(questions)) as pool:
        return list(pool.map(ask, questions))


def test_server_answers_equal_the_engine_without_speculation(model_dir, tmp_path):
    plain = engine_outputs(speculative=False)["chat"]
    with vllm_server(model_dir, tmp_path / "ngramspec.log", NGRAMSPEC) as client:
        speculative = ask_all(client)
        metrics = client.with_options(max_retries=0)._client.get(str(client.base_url).replace("/v1/", "/metrics")).text
    assert "ngramspec.vllm.Proposer" in (tmp_path / "ngramspec.log").read_text()
    accepted = sum(float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith("vllm:spec_decode_num_accepted_tokens_total"))
    assert accepted > 20, "the server ran, but no draft was accepted"
    assert all(plain) and len(plain) == len(chat_questions())
    assert speculative == plain
