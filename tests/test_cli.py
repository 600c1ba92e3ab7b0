"""`ngramspec rewrite|summarize` on a tiny random model with a real tokenizer: as a subprocess
where the process boundary is what is tested (Ctrl-C, `python -m ngramspec`, `accelerate
launch`), otherwise in this process through the same ``main()`` the command runs."""

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ngramspec.chunking import join_chunks, split_document
from ngramspec.documents import DocumentJob, clean_output
from ngramspec.files import read_jsonl

from conftest import call_main
from test_chunking import DOCUMENT  # a Markdown document with every structure chunking keeps

ROOT = Path(__file__).resolve().parent.parent


def cli(args, env_extra=None, stdin=None, timeout=300):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "ngramspec", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, input=stdin, timeout=timeout)


@pytest.fixture()
def cache_env(tmp_path):
    return {"NGRAMSPEC_CACHE": str(tmp_path / "cache")}


def run_main(args, monkeypatch, capsys, cache_env, stdin: bytes = b"") -> tuple[int, str, str]:
    """``ngramspec ARGS`` in this process: (exit code, stdout, stderr)."""
    from ngramspec import cli as cli_module

    monkeypatch.setenv("NGRAMSPEC_CACHE", cache_env["NGRAMSPEC_CACHE"])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    return call_main(cli_module.main, args, capsys)


def test_clean_output_unwraps_a_fence_the_source_did_not_have():
    assert clean_output("```python\nx = 1\n```", "x = 0") == "x = 1"
    assert clean_output("```python\nx = 1\n```", "```python\nx = 0\n```") == "```python\nx = 1\n```"
    assert clean_output("  text \n", "t") == "text"


def test_rewrite_round_trips_structure_and_equals_the_library(tiny_model_dir, tmp_path, cache_env, monkeypatch,
                                                              capsys):
    source = tmp_path / "notes.md"
    source.write_text(DOCUMENT)
    out = tmp_path / "out.md"
    args = ["rewrite", str(source), "--instruction", "Fix the grammar.", "-o", str(out), "--model", str(tiny_model_dir),
            "--max-new-tokens", "12", "--chunk-tokens", "32", "--quiet", "--stats"]
    code, _, err = run_main(args, monkeypatch, capsys, cache_env)
    assert code == 0, err
    stats = json.loads(err.strip().splitlines()[-1])
    assert stats["chunks"] >= 3 and stats["new_tokens"] > 0 and stats["target_forwards"] > 0
    assert source.read_text() == DOCUMENT  # input untouched

    # The same chunks through the library's plain greedy generate() give the same document.
    from ngramspec import load_model

    model, tokenizer = load_model(str(tiny_model_dir))
    job = DocumentJob(model, tokenizer, speculator=None, max_new_tokens=12, chunk_tokens=32)
    chunks = job.chunks(DOCUMENT, "markdown")
    bodies, previous = [], ""
    for chunk in chunks:
        ids = job.prompt_ids("Fix the grammar.", chunk.body, previous[-300:])
        with torch.no_grad():
            new = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :]
        previous = clean_output(tokenizer.decode(new, skip_special_tokens=True), chunk.body)
        bodies.append(previous)
    assert out.read_text() == join_chunks(chunks, bodies)
    # Structure between chunks survives: the blank-line skeleton around every chunk.
    text = out.read_text()
    for chunk in chunks[:-1]:
        assert chunk.trail in text


def test_in_place_keeps_a_backup_and_stdin_works(tiny_model_dir, tmp_path, cache_env, monkeypatch, capsys):
    source = tmp_path / "a.txt"
    source.write_text("One paragraph.\n\nAnother paragraph.\n")
    code, _, err = run_main(["rewrite", str(source), "--instruction", "Shorten.", "--in-place", "--model",
                             str(tiny_model_dir), "--max-new-tokens", "5", "--quiet"], monkeypatch, capsys, cache_env)
    assert code == 0, err
    assert (tmp_path / "a.txt.bak").read_text() == "One paragraph.\n\nAnother paragraph.\n"
    assert source.read_text() != (tmp_path / "a.txt.bak").read_text()
    code, out, err = run_main(["summarize", "-", "--model", str(tiny_model_dir), "--max-new-tokens", "5", "--quiet"],
                              monkeypatch, capsys, cache_env, stdin=b"Some text to summarize.\n")
    assert code == 0 and out.strip(), err


@pytest.mark.parametrize(
    "args, content, message",
    [
        (["rewrite", "{missing}", "--instruction", "x"], None, "no such file"),
        (["rewrite", "{file}", "--instruction", "x"], b"\x00\x01binary\x00", "looks binary"),
        (["rewrite", "{file}", "--instruction", "x"], b"\xff\xfe\xfa not utf8", "not UTF-8"),
        (["rewrite", "{file}", "--instruction", "x"], b"  \n\n ", "is empty"),
        (["rewrite", "{file}", "--instruction", "   "], b"text", "instruction is empty"),
        pytest.param(["rewrite", "{file}", "--instruction", "x", "--model", "no-such/model-xyz"], b"text",
                     "cannot load model", marks=pytest.mark.slow),  # a subprocess
        (["rewrite", "{file}", "--instruction", "x", "-o", "{file}"], b"text", "would overwrite the input"),
        (["rewrite", "{file}", "--instruction", "x", "--max-draft-tokens", "0"], b"text", "speculator setting"),
        (["rewrite", "{file}", "--instruction", "x", "--chunk-tokens", "31"], b"text",
         "--chunk-tokens must be at least 32"),
        (["rewrite", "-", "--instruction", "x", "--in-place"], b"text", "--in-place needs a file"),
        (["rewrite", "{file}", "{missing}", "--instruction", "x", "--in-place"], b"text", "no such file"),
        (["rewrite", "{file}", "{other}", "--instruction", "x"], b"text", "several inputs need --out-dir"),
        (["rewrite", "{file}", "{other}", "--instruction", "x", "-o", "{missing}"], b"text",
         "-o/--output takes one input"),
        (["rewrite", "{file}", "-", "--instruction", "x", "--out-dir", "{dir}"], b"text", "'-' (stdin) can only be"),
        (["rewrite", "{file}", "{file}", "--instruction", "x", "--out-dir", "{dir}"], b"text", "given twice"),
        (["rewrite", "{file}", "{samename}", "--instruction", "x", "--out-dir", "{dir}"], b"text",
         "their outputs would collide"),
        (["rewrite", "{file}", "--instruction", "x", "--out-dir", "{dir}", "--in-place"], b"text", "give one of"),
        (["rewrite", "{file}", "--instruction", "x", "--out-dir", "{file}"], b"text", "is a file, not a folder"),
    ],
)
def test_error_paths_exit_2_with_a_message(tmp_path, cache_env, args, content, message, monkeypatch, capsys):
    file = tmp_path / "input.txt"
    if content is not None:
        file.write_bytes(content)
    (tmp_path / "other.txt").write_text("other text")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "input.txt").write_text("same name")
    places = {"{file}": file, "{missing}": tmp_path / "missing.txt", "{other}": tmp_path / "other.txt",
              "{samename}": tmp_path / "sub" / "input.txt", "{dir}": tmp_path / "out"}
    args = [str(places.get(a, a)) for a in args]
    if "--model" in args:  # a hub lookup: in a subprocess, where HF_HUB_OFFLINE=1 takes effect
        done = cli(args, cache_env, stdin="")
        code, stderr = done.returncode, done.stderr
    else:  # in-process: the same main() the command runs, without a new interpreter per case
        code, _, stderr = run_main(args, monkeypatch, capsys, cache_env)
    assert code == 2, stderr
    assert message in stderr and "Traceback" not in stderr
    if content is not None:
        assert file.read_bytes() == content  # never touched


def test_options_default_to_the_document_job_settings():
    from ngramspec.cli import build_parser
    from ngramspec.documents import CHUNK_TOKENS, SUMMARIZE_INSTRUCTION

    args = build_parser().parse_args(["summarize", "notes.txt"])
    assert (args.instruction, args.chunk_tokens) == (SUMMARIZE_INSTRUCTION, CHUNK_TOKENS)
    assert build_parser().parse_args(["rewrite", "a", "--instruction", "x"]).chunk_tokens == CHUNK_TOKENS


def test_missing_instruction_is_a_usage_error(monkeypatch, capsys, cache_env):
    code, _, err = run_main(["rewrite", "x.txt"], monkeypatch, capsys, cache_env)
    assert code == 2 and "--instruction" in err


@pytest.mark.slow
def test_interrupt_leaves_everything_intact_and_resume_continues(tiny_model_dir, tmp_path, cache_env):
    paragraphs = [f"Paragraph number {i} has a few words in it." for i in range(40)]
    source = tmp_path / "long.txt"
    source.write_text("\n\n".join(paragraphs) + "\n")
    out = tmp_path / "long.out.txt"
    args = ["rewrite", str(source), "--instruction", "Fix.", "-o", str(out), "--model", str(tiny_model_dir),
            "--max-new-tokens", "60", "--chunk-tokens", "32", "--quiet", "--stats"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **cache_env}
    # SIGINT as Ctrl-C sends it; restored to the default in the child, because a test run started
    # as a background job inherits SIGINT ignored, and Python keeps an ignored SIGINT ignored.
    process = subprocess.Popen([sys.executable, "-m", "ngramspec", *args], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    resume_dir = Path(cache_env["NGRAMSPEC_CACHE"]) / "resume"
    deadline = time.time() + 120
    while time.time() < deadline and not any(resume_dir.glob("*.jsonl")):
        time.sleep(0.02)
    assert process.poll() is None, "finished before it could be interrupted"
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130 and "--resume" in stderr, stderr
    assert source.read_text() == "\n\n".join(paragraphs) + "\n" and not out.exists()
    saved = {r["index"] for r in read_jsonl(resume_dir.glob("*.jsonl"))}  # chunks done before the interrupt
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    count = lambda t: len(tokenizer(t, add_special_tokens=False)["input_ids"])
    total = len(split_document(source.read_text(), 32, count, "text"))
    assert 0 < len(saved) < total

    resumed = cli(args + ["--resume"], cache_env)
    assert resumed.returncode == 0, resumed.stderr
    stats = json.loads(resumed.stderr.strip().splitlines()[-1])
    assert stats["chunks"] == total - len(saved)  # only the unfinished chunks were generated
    fresh = cli(args[:5] + [str(tmp_path / "fresh.txt")] + args[6:], cache_env)
    assert fresh.returncode == 0, fresh.stderr
    assert out.read_text() == (tmp_path / "fresh.txt").read_text()  # resume gives the same result
    assert not any(resume_dir.iterdir())  # state removed after success


DOCUMENTS = {
    "a.md": DOCUMENT,
    "b.txt": "A short note.\n\nIt has two paragraphs, and this one is the second.\n",
    "c.py": "import os\n\n\ndef f(x):\n    return os.path.join(x, x)\n",
}


def _write_documents(folder: Path) -> list[str]:
    folder.mkdir()
    for name, text in DOCUMENTS.items():
        (folder / name).write_text(text)
    return [str(folder / name) for name in DOCUMENTS]


@pytest.mark.slow
def test_many_documents_sharded_over_two_processes_equal_one_process(tiny_model_dir, tmp_path, cache_env, monkeypatch,
                                                                     capsys):
    """`accelerate launch` with 2 CPU processes splits the documents and merges the stats; every
    output equals what one process writes for the same inputs."""
    from ngramspec.cli import shard_by_size

    assert shard_by_size([5, 1, 4, 3], 2) == [[0, 1], [2, 3]]  # largest first, to the least loaded
    assert shard_by_size([2, 2], 3) == [[0], [1], []]
    inputs = _write_documents(tmp_path / "docs")
    common = ["rewrite", *inputs, "--instruction", "Fix the grammar.", "--model", str(tiny_model_dir),
              "--max-new-tokens", "12", "--chunk-tokens", "32", "--quiet", "--stats"]
    code, _, err = run_main(common + ["--out-dir", str(tmp_path / "one")], monkeypatch, capsys, cache_env)
    assert code == 0, err

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **cache_env}
    launcher = Path(sys.executable).parent / "accelerate"
    launch = [str(launcher), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "ngramspec"]
    sharded = subprocess.run(launch + common + ["--out-dir", str(tmp_path / "two")], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    for name in DOCUMENTS:
        assert (tmp_path / "two" / name).read_text() == (tmp_path / "one" / name).read_text()
        assert (tmp_path / "docs" / name).read_text() == DOCUMENTS[name]  # inputs untouched
    lines = [json.loads(line) for line in sharded.stderr.splitlines() if line.startswith("{")]
    per_document, merged = lines[:-1], lines[-1]
    assert sorted(Path(r["input"]).name for r in per_document) == sorted(DOCUMENTS)
    assert {r["process"] for r in per_document} == {0, 1}  # both processes got work
    assert merged["documents"] == 3 and merged["processes"] == 2
    assert merged["new_tokens"] == sum(r["new_tokens"] for r in per_document) > 0


def test_many_documents_in_place_resume_skips_finished_ones(tiny_model_dir, tmp_path, cache_env, monkeypatch, capsys):
    """--in-place over several files, interrupted after every file was written but before the run
    ended: --resume must not rewrite an already rewritten file a second time."""
    from ngramspec import cli as cli_module

    inputs = _write_documents(tmp_path / "docs")
    monkeypatch.setenv("NGRAMSPEC_CACHE", cache_env["NGRAMSPEC_CACHE"])
    args = ["rewrite", *inputs, "--instruction", "Fix.", "--in-place", "--model", str(tiny_model_dir),
            "--max-new-tokens", "8", "--chunk-tokens", "32", "--quiet", "--stats"]
    clear = cli_module.ResumeState.clear
    monkeypatch.setattr(cli_module.ResumeState, "clear", lambda self: None)  # as if killed at the very end
    assert cli_module.main(args) == 0
    monkeypatch.setattr(cli_module.ResumeState, "clear", clear)
    first = {name: (tmp_path / "docs" / name).read_text() for name in DOCUMENTS}
    assert all((tmp_path / "docs" / (name + ".bak")).read_text() == DOCUMENTS[name] for name in DOCUMENTS)
    capsys.readouterr()
    assert cli_module.main(args + ["--resume"]) == 0
    merged = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert merged["documents"] == 0  # nothing left to do
    assert {name: (tmp_path / "docs" / name).read_text() for name in DOCUMENTS} == first
    assert all((tmp_path / "docs" / (name + ".bak")).read_text() == DOCUMENTS[name] for name in DOCUMENTS)
    assert not any((Path(cache_env["NGRAMSPEC_CACHE"]) / "resume").iterdir())  # no state left behind
