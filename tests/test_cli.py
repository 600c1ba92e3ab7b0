"""`ngramspec rewrite|summarize` on a tiny random model with a real tokenizer: as a subprocess
where the process boundary is what is tested (Ctrl-C, `python -m ngramspec`, `accelerate
launch`), otherwise in this process through the same ``main()`` the command runs."""

import errno
import fcntl
import io
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from rapidfuzz import fuzz

from ngramspec.app.chunking import join_chunks, split_document
from ngramspec.app.documents import DocumentJob, clean_output
from ngramspec.util.files import read_jsonl

from conftest import call_main
from test_chunking import DOCUMENT  # a Markdown document with every structure chunking keeps

ROOT = Path(__file__).resolve().parent.parent


def cli(args, env_extra=None, stdin=None, timeout=300):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "ngramspec", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, input=stdin, timeout=timeout)


def run_main(args, monkeypatch, capsys, cache_env, stdin: bytes = b"") -> tuple[int, str, str]:
    """``ngramspec ARGS`` in this process: (exit code, stdout, stderr)."""
    from ngramspec.app import cli as cli_module

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
            "--max-new-tokens", "12", "--chunk-tokens", "32", "--quiet", "--stats", "--keep-drifted", "0"]
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
                             str(tiny_model_dir), "--max-new-tokens", "5", "--quiet", "--keep-drifted", "0"],
                            monkeypatch, capsys, cache_env)
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
    from ngramspec.app.cli import build_parser, job_settings
    from ngramspec.app.documents import SUMMARIZE_INSTRUCTION
    from ngramspec.app.settings import JobSettings

    defaults = JobSettings()
    args = build_parser().parse_args(["summarize", "notes.txt"])
    assert (args.instruction, args.chunk_tokens) == (SUMMARIZE_INSTRUCTION, defaults.chunk_tokens)
    assert job_settings(args) == defaults  # summarize: no drift options, their defaults
    args = build_parser().parse_args(["rewrite", "a", "--instruction", "x"])
    assert (args.chunk_tokens, args.keep_drifted, args.max_growth) == (
        defaults.chunk_tokens, defaults.similarity_floor, defaults.max_growth)
    assert job_settings(args) == defaults
    args = build_parser().parse_args(["rewrite", "a", "--instruction", "x", "--chunk-tokens", "100",
                                      "--keep-drifted", "0.5", "--max-growth", "2"])
    assert job_settings(args) == JobSettings(chunk_tokens=100, similarity_floor=0.5, max_growth=2.0)


def test_missing_instruction_is_a_usage_error(monkeypatch, capsys, cache_env):
    code, _, err = run_main(["rewrite", "x.txt"], monkeypatch, capsys, cache_env)
    assert code == 2 and "--instruction" in err


SLOW_CHUNKS = """
import sys, time
from ngramspec.app.process import ResumeState
save = ResumeState.save
def slow_save(self, *args, **kwargs):
    save(self, *args, **kwargs)
    time.sleep(0.3)
ResumeState.save = slow_save
from ngramspec.app.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])  # Ctrl-C, and what `kill` sends
def test_interrupt_leaves_everything_intact_and_resume_continues(tiny_model_dir, tmp_path, cache_env, monkeypatch,
                                                                 capsys, signum):
    paragraphs = [f"Paragraph number {i} has a few words in it." for i in range(40)]
    source = tmp_path / "long.txt"
    source.write_text("\n\n".join(paragraphs) + "\n")
    out = tmp_path / "long.out.txt"
    args = ["rewrite", str(source), "--instruction", "Fix.", "-o", str(out), "--model", str(tiny_model_dir),
            "--max-new-tokens", "60", "--chunk-tokens", "32", "--quiet", "--stats", "--keep-drifted", "0"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **cache_env}
    # SIGINT as Ctrl-C sends it; restored to the default in the child, because a test run started
    # as a background job inherits SIGINT ignored, and Python keeps an ignored SIGINT ignored.
    # The child pauses 0.3 s after saving each chunk: without it a fast machine finishes every
    # chunk within about a second, a window a loaded test runner can sleep through.
    process = subprocess.Popen([sys.executable, "-c", SLOW_CHUNKS, *args], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    resume_dir = Path(cache_env["NGRAMSPEC_CACHE"]) / "resume"
    deadline = time.time() + 120
    # Interrupt once a chunk is saved (the log may exist before its first record, e.g. while a
    # fresh clone's first run compiles the drafting kernels).
    while time.time() < deadline and not any("index" in r for r in read_jsonl(resume_dir.glob("*.jsonl"))):
        time.sleep(0.02)
    assert process.poll() is None, "finished before it could be interrupted"
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signum and "--resume" in stderr, stderr
    assert f"interrupted ({signal.Signals(signum).name})" in stderr
    assert source.read_text() == "\n\n".join(paragraphs) + "\n" and not out.exists()
    assert not (tmp_path / ".long.out.txt.lock").exists()  # the lock released
    saved = {r["index"] for r in read_jsonl(resume_dir.glob("*.jsonl"))}  # chunks done before the interrupt
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    count = lambda t: len(tokenizer(t, add_special_tokens=False)["input_ids"])
    total = len(split_document(source.read_text(), 32, count, "text"))
    assert 0 < len(saved) < total

    # The rerun and the uninterrupted reference run in this process (only the interrupt needs one).
    code, _, err = run_main(args + ["--resume"], monkeypatch, capsys, cache_env)
    assert code == 0, err
    stats = json.loads(err.strip().splitlines()[-1])
    # every chunk counted, the resumed ones too; only the unfinished ones were generated
    assert (stats["chunks"], stats["resumed_chunks"]) == (total, len(saved))
    code, _, err = run_main(args[:5] + [str(tmp_path / "fresh.txt")] + args[6:], monkeypatch, capsys, cache_env)
    assert code == 0, err
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
    from ngramspec.app.cli import shard_by_size

    assert shard_by_size([5, 1, 4, 3], 2) == [[0, 1], [2, 3]]  # largest first, to the least loaded
    assert shard_by_size([2, 2], 3) == [[0], [1], []]
    inputs = _write_documents(tmp_path / "docs")
    common = ["rewrite", *inputs, "--instruction", "Fix the grammar.", "--model", str(tiny_model_dir),
              "--max-new-tokens", "12", "--chunk-tokens", "32", "--quiet", "--stats", "--keep-drifted", "0"]
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
    from ngramspec.app import cli as cli_module
    from ngramspec.app.process import ResumeState

    inputs = _write_documents(tmp_path / "docs")
    monkeypatch.setenv("NGRAMSPEC_CACHE", cache_env["NGRAMSPEC_CACHE"])
    args = ["rewrite", *inputs, "--instruction", "Fix.", "--in-place", "--model", str(tiny_model_dir),
            "--max-new-tokens", "8", "--chunk-tokens", "32", "--quiet", "--stats", "--keep-drifted", "0"]
    clear = ResumeState.clear
    monkeypatch.setattr(ResumeState, "clear", lambda self: None)  # as if killed at the very end
    assert cli_module.main(args) == 0
    monkeypatch.setattr(ResumeState, "clear", clear)
    first = {name: (tmp_path / "docs" / name).read_text() for name in DOCUMENTS}
    assert all((tmp_path / "docs" / (name + ".bak")).read_text() == DOCUMENTS[name] for name in DOCUMENTS)
    capsys.readouterr()
    assert cli_module.main(args) == 2  # without --resume: refused, the .bak (the original) not overwritten
    assert f"{inputs[0]} was rewritten in place by an earlier run that did not finish" in capsys.readouterr().err
    assert cli_module.main(args + ["--resume"]) == 0
    merged = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert merged["documents"] == 0  # nothing left to do
    assert {name: (tmp_path / "docs" / name).read_text() for name in DOCUMENTS} == first
    assert all((tmp_path / "docs" / (name + ".bak")).read_text() == DOCUMENTS[name] for name in DOCUMENTS)
    assert not any((Path(cache_env["NGRAMSPEC_CACHE"]) / "resume").iterdir())  # no state left behind


def _main(args):
    from ngramspec.app import cli as cli_module

    return cli_module.main(args)


def _rewrite(source, tiny_model_dir, *more):
    """A rewrite with the drift guard off: the fake replies (upper case) are what is tested."""
    return ["rewrite", str(source), "--instruction", "Fix typos.", "--model", str(tiny_model_dir), "--quiet",
            "--keep-drifted", "0", *more]


@pytest.mark.parametrize("raw", [
    "\ufeffFirst line.\r\nSecond line.\r\n\r\nA paragraph.\r\n",  # BOM, CRLF, trailing newline
    "First line.\nSecond line.\n\nA paragraph.",  # LF, no trailing newline
])
def test_line_breaks_bom_and_trailing_newline_come_back_as_they_went_in(tiny_model_dir, tmp_path, fake_replies,
                                                                        capsys, raw):
    source = tmp_path / "in.txt"
    source.write_bytes(raw.encode())
    out = tmp_path / "out.txt"
    assert _main(_rewrite(source, tiny_model_dir, "-o", str(out))) == 0, capsys.readouterr().err
    assert out.read_bytes() == raw.upper().encode()  # upper() keeps the BOM and CR as they are
    assert fake_replies.seen and not any("\r" in b or "\ufeff" in b for b in fake_replies.seen)  # model: LF only
    assert _main(_rewrite(source, tiny_model_dir, "--in-place")) == 0
    assert source.read_bytes() == raw.upper().encode()
    assert (tmp_path / "in.txt.bak").read_bytes() == raw.encode()  # the original, byte for byte


def test_quiet_hides_the_weight_loading_bar(tiny_model_dir, tmp_path, fake_replies, capsys):
    source = tmp_path / "in.txt"
    source.write_text("Some text.\n")
    args = _rewrite(source, tiny_model_dir, "-o", str(tmp_path / "out.txt"))
    assert _main([a for a in args if a != "--quiet"]) == 0
    assert "Loading weights" in capsys.readouterr().err  # shown without --quiet (so this test can see it)
    assert _main(args) == 0
    assert capsys.readouterr().err == ""
    from transformers.utils import logging

    assert logging.is_progress_bar_enabled()  # put back after loading


def test_devices_and_fifos_are_written_through(tiny_model_dir, tmp_path, fake_replies, capsys, no_renames):
    source = tmp_path / "in.txt"
    source.write_text("Some text.\n")
    assert _main(_rewrite(source, tiny_model_dir, "-o", "/dev/null")) == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    assert _main(_rewrite(source, tiny_model_dir, "-o", str(fifo))) == 0
    reader.join(timeout=30)
    assert received == ["SOME TEXT.\n"] and stat.S_ISFIFO(fifo.stat().st_mode)
    assert source.read_text() == "Some text.\n" and not any(tmp_path.glob(".*"))  # no lock or temporary file


def test_a_symlinked_output_stays_a_link_to_the_new_file(tiny_model_dir, tmp_path, fake_replies, capsys):
    source = tmp_path / "in.txt"
    source.write_text("Some text.\n")
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real.name)
    assert _main(_rewrite(source, tiny_model_dir, "-o", str(link))) == 0
    assert link.is_symlink() and real.read_text() == "SOME TEXT.\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "in.txt", "link.txt", "real.txt"]


def test_a_failed_write_exits_1_and_leaves_files_whole(tiny_model_dir, tmp_path, fake_replies, capsys, monkeypatch,
                                                       no_renames):
    source = tmp_path / "in.txt"
    source.write_text("Some text.\n")
    assert _main(_rewrite(source, tiny_model_dir, "-o", "/dev/full")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write /dev/full: No space left on device" in err and "Traceback" not in err
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)

    out = tmp_path / "out.txt"
    out.write_text("earlier output\n")
    from ngramspec.util import files

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "replace", full)
    assert _main(_rewrite(source, tiny_model_dir, "-o", str(out), "--resume")) == 1  # its chunk was saved
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot write {out}: No space left on device" in err
    assert out.read_text() == "earlier output\n" and source.read_text() == "Some text.\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "in.txt", "out.txt"]  # no temporary or lock file


def test_a_second_run_on_the_same_output_is_refused_at_once(tiny_model_dir, tmp_path, fake_replies, capsys):
    source = tmp_path / "in.txt"
    source.write_text("Some text.\n")
    out = tmp_path / "out.txt"
    out.write_text("earlier output\n")
    with open(tmp_path / ".out.txt.lock", "w") as held:  # as a running ngramspec holds it
        fcntl.flock(held, fcntl.LOCK_EX)
        assert _main(_rewrite(source, tiny_model_dir, "-o", str(out))) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"another ngramspec run is writing {out}" in err
        assert _main(_rewrite(source, tiny_model_dir, "--in-place")) == 0  # other outputs are free
    assert out.read_text() == "earlier output\n" and not fake_replies.seen[1:]
    assert _main(_rewrite(tmp_path / "in.txt.bak", tiny_model_dir, "-o", str(out))) == 0  # released: runs
    assert out.read_text() == "SOME TEXT.\n" and not (tmp_path / ".out.txt.lock").exists()


def test_drifted_chunks_are_kept_by_default_and_said_so_even_when_quiet(tiny_model_dir, tmp_path, fake_replies,
                                                                        capsys):
    source = tmp_path / "in.txt"
    first, second = (f"Teh {n} paragraph has a handful of words in it, enough to fill most of a chunk."
                     for n in ("first", "second"))
    source.write_text(f"{first}\n\n{second}\n")  # two chunks of at most 32 tokens
    fake_replies.reply = lambda body: "An unrelated sentence." if "second" in body else body.replace("Teh", "The")
    out = tmp_path / "out.txt"
    args = ["rewrite", str(source), "--instruction", "Fix typos.", "--model", str(tiny_model_dir), "--quiet",
            "-o", str(out), "--chunk-tokens", "32", "--stats"]
    assert _main(args) == 3  # some chunks were kept as they were
    err = capsys.readouterr().err.strip().splitlines()
    fixed = first.replace("Teh", "The")
    assert out.read_text() == f"{fixed}\n\n{second}\n"  # the drifted chunk as it was, the other fixed
    score = fuzz.ratio(second, "An unrelated sentence.") / 100
    assert [line for line in err if "kept as it was" in line] == [
        f"ngramspec rewrite: {source}: chunk 2/2 kept as it was: its rewrite drifted (similarity {score:.3f} < 0.8); "
        "--keep-drifted 0 uses it anyway"]
    stats = json.loads(err[-1])
    assert stats["guarded_chunks"] == 1 and stats["chunks"] == 2 and stats["resumed_chunks"] == 0
    # similarities of the text written: the kept chunk is its source (1.0), the fixed one its rewrite
    assert stats["similarity_min"] == round(fuzz.ratio(first, fixed) / 100, 3) and score < stats["similarity_min"]
    assert stats["similarity_mean"] == round((fuzz.ratio(first, fixed) / 100 + 1.0) / 2, 3)

    assert _main(args + ["--keep-drifted", "0"]) == 0  # the guard off: the drifted rewrite is used
    assert out.read_text() == f"{fixed}\n\nAn unrelated sentence.\n"
    assert json.loads(capsys.readouterr().err.strip().splitlines()[-1])["guarded_chunks"] == 0

    fake_replies.reply = lambda body: body + " Also, here is an extra sentence the model made up on its own." * 2
    assert _main(args) == 3  # too long
    assert "as long as its source (over --max-growth 1.3)" in capsys.readouterr().err
    assert _main(args + ["--max-growth", "3", "--keep-drifted", "0.5"]) == 0  # allowed to grow


@pytest.mark.parametrize("args, message", [
    (["--keep-drifted", "1.5"], "--keep-drifted takes a similarity between 0 and 1"),
    (["--keep-drifted", "-0.1"], "--keep-drifted takes a similarity between 0 and 1"),
    (["--max-growth", "0.9"], "--max-growth takes a length ratio of at least 1"),
    (["--diff", "-o", "x.txt"], "--diff prints to stdout"),
    (["--diff", "--in-place"], "--diff prints to stdout"),
])
def test_drift_and_diff_usage_errors(tmp_path, args, message, capsys):
    source = tmp_path / "in.txt"
    source.write_text("text")
    assert _main(["rewrite", str(source), "--instruction", "x", *args]) == 2
    assert message in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # summarize has neither option
        _main(["summarize", str(source), *args[:1 if args[0] == "--diff" else 2]])
    assert exit_.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_diff_prints_a_patch_and_writes_nothing(tiny_model_dir, tmp_path, fake_replies, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("a.txt").write_text("Teh first line.\nA second line.\nteh end")
    Path("b.txt").write_text("Nothing to fix.\n")
    Path("c.txt").write_text("The longest file, processed first, with teh typo on its last line.\n" * 3)
    fake_replies.reply = lambda body: body.replace("Teh", "The").replace("teh", "the")
    assert _main(["rewrite", "a.txt", "b.txt", "c.txt", "--instruction", "Fix typos.", "--model",
                  str(tiny_model_dir), "--quiet", "--diff"]) == 0
    diff = capsys.readouterr().out
    assert diff.startswith("--- a.txt\n+++ a.txt\n@@ -1,3 +1,3 @@\n-Teh first line.\n+The first line.\n A second "
                           "line.\n-teh end\n\\ No newline at end of file\n+the end\n\\ No newline at end of file\n"
                           "--- c.txt\n+++ c.txt\n")  # in input order (c was rewritten first); b: no changes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt", "c.txt", "cache"]
    Path("changes.diff").write_text(diff)
    subprocess.run(["patch", "-p0", "-i", "changes.diff"], check=True, capture_output=True)
    assert Path("a.txt").read_text() == "The first line.\nA second line.\nthe end"
    assert Path("c.txt").read_text() == "The longest file, processed first, with the typo on its last line.\n" * 3


@pytest.mark.slow  # a CLI process
def test_sigkill_then_resume_gives_the_bytes_of_an_uninterrupted_run(tiny_model_dir, tmp_path, cache_env, monkeypatch,
                                                                      capsys):
    paragraphs = [f"Paragraph {i} has a few words in it, then a few more, to fill most of a chunk." for i in range(8)]
    source = tmp_path / "long.txt"
    source.write_bytes("\r\n\r\n".join(paragraphs).encode() + b"\r\n")
    out = tmp_path / "out.txt"
    args = ["rewrite", str(source), "--instruction", "Fix.", "-o", str(out), "--model", str(tiny_model_dir),
            "--max-new-tokens", "40", "--chunk-tokens", "32", "--quiet", "--keep-drifted", "0"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **cache_env}
    # The child pauses 0.3 s after saving each chunk: without it a fast machine finishes every
    # chunk within about a second, a window a loaded test runner can sleep through.
    process = subprocess.Popen([sys.executable, "-c", SLOW_CHUNKS, *args], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    resume_dir = Path(cache_env["NGRAMSPEC_CACHE"]) / "resume"
    deadline = time.time() + 120
    while time.time() < deadline and not read_jsonl(resume_dir.glob("*.jsonl")):
        time.sleep(0.01)
    process.kill()  # SIGKILL: no handler runs, nothing is cleaned up
    assert process.wait(timeout=60) == -signal.SIGKILL
    saved = read_jsonl(resume_dir.glob("*.jsonl"))
    assert 0 < len(saved) < len(paragraphs) and not out.exists()  # one chunk per paragraph

    # The rerun and the uninterrupted reference run in this process (only the kill needs one).
    code, _, err = run_main(args + ["--resume", "--stats"], monkeypatch, capsys, cache_env)
    assert code == 0, err
    stats = json.loads(err.strip().splitlines()[-1])
    assert (stats["chunks"], stats["resumed_chunks"]) == (len(paragraphs), len(saved))
    code, _, err = run_main(args[:5] + [str(tmp_path / "fresh.txt")] + args[6:], monkeypatch, capsys, cache_env)
    assert code == 0, err
    assert out.read_bytes() == (tmp_path / "fresh.txt").read_bytes()
    assert out.read_bytes().count(b"\r\n") == out.read_bytes().count(b"\n")  # CRLF throughout
    assert not (tmp_path / ".out.txt.lock").exists()  # the killed run's lock file, removed by the rerun


def test_every_speculator_setting_is_an_explained_option_parsed_like_the_config():
    """--help says what each setting does (its first sentence in SpeculatorConfig's docstring),
    and each option is parsed by the config's own parser: a cost curve, "auto", a bad value."""
    from ngramspec.app.cli import _speculator_config, build_parser
    from ngramspec.draft.config import SpeculatorConfig, setting_fields

    parser = build_parser(full=True)  # --help-all's parser: every setting with its help
    sub = next(a for a in parser._actions if a.dest == "command").choices["rewrite"]
    helps = {a.dest: a.help for a in sub._actions}
    for name in setting_fields():  # a sub-config's settings too: --cost-tuning-window
        assert len(helps[name]) > 20 and "``" not in helps[name] and ":mod:" not in helps[name], name
    assert helps["edit_recurrence"].startswith("edits recur")
    base = ["rewrite", "in.txt", "--instruction", "x"]
    config = _speculator_config(parser.parse_args(base + ["--verify-cost", "1:1,8:1.5", "--no-copy-cursor"]))
    assert config.verify_cost == ((1, 1.0), (8, 1.5)) and config.copy_cursor is False
    assert _speculator_config(parser.parse_args(base)) == SpeculatorConfig()  # "auto" is the default: None
    tuned = _speculator_config(parser.parse_args(base + ["--cost-tuning-window", "20", "--cost-tuning-same-load", "2"]))
    assert (tuned.cost_tuning.window, tuned.cost_tuning.same_load) == (20, 2.0)
    with pytest.raises(SystemExit):
        parser.parse_args(base + ["--verify-cost", "1:1,8:abc"])
