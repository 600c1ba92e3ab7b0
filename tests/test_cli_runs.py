"""`ngramspec rewrite|summarize` as a user meets it (issue 49): stdout shows what is kept, each
chunk's verdict gets its own stderr line as it happens, output paths are checked before the
model loads, SIGTERM/SIGHUP act as Ctrl-C, saved progress is never dropped silently, the
stats describe the written text, and --help fits one screen. In this process on the tiny model
with scripted replies (``fake_replies``), except where the process boundary is the test."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rapidfuzz import fuzz

from test_cli import ROOT, _main

FIRST = "Teh first paragraph has a handful of words in it, enough to fill most of a chunk."
SECOND = "Teh second paragraph has a handful of words in it, enough to fill most of a chunk."
FIXED = FIRST.replace("Teh", "The")


def _fix_first_drift_second(body):
    return "An unrelated sentence." if "second" in body else body.replace("Teh", "The")


def _args(source, tiny_model_dir, *more):
    return ["rewrite", str(source), "--instruction", "Fix typos.", "--model", str(tiny_model_dir),
            "--chunk-tokens", "32", *more]


def _verdicts(err: str) -> list[str]:
    """The command's own lines, each required to start a line (after a newline or the progress
    bar's carriage return) and to end with a newline: never glued to the bar."""
    return re.findall(r"(?:^|[\r\n])(ngramspec (?:rewrite|summarize): [^\r\n]*)\n", err)


@pytest.fixture()
def document(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text(f"{FIRST}\n\n{SECOND}\n")  # two chunks of at most 32 tokens
    return source


def test_a_terminal_sees_the_kept_text_and_one_verdict_line_per_chunk(tiny_model_dir, document, tmp_path,
                                                                      fake_replies, capsys, monkeypatch):
    from ngramspec.app import cli

    fake_replies.reply = _fix_first_drift_second
    monkeypatch.setattr(cli, "_is_terminal", lambda: True)
    printed = []  # what the terminal had when each verdict line came

    def reply(body):
        printed.append(capsys.readouterr())
        return _fix_first_drift_second(body)

    fake_replies.reply = reply
    assert _main(_args(document, tiny_model_dir)) == 3
    out, err = capsys.readouterr()
    out, err = "".join(p.out for p in printed) + out, "".join(p.err for p in printed) + err
    assert out == f"{FIXED}\n\n{SECOND}\n"  # never "An unrelated sentence.": the guard discarded it
    assert printed[1].out == f"{FIXED}\n\n"  # the first chunk was shown before the second was generated
    score = fuzz.ratio(SECOND, "An unrelated sentence.") / 100
    assert _verdicts(err) == [
        f"ngramspec rewrite: {document}: chunk 1/2 rewritten (similarity {fuzz.ratio(FIRST, FIXED) / 100:.3f})",
        f"ngramspec rewrite: {document}: chunk 2/2 kept as it was: its rewrite drifted (similarity {score:.3f} "
        "< 0.8); --keep-drifted 0 uses it anyway"]
    assert _verdicts(printed[1].err) == _verdicts(err)[:1]  # the first verdict before the second chunk

    out_file = tmp_path / "out.txt"
    assert _main(_args(document, tiny_model_dir, "-o", str(out_file), "--quiet")) == 3
    assert out_file.read_text() == out  # stdout in a terminal equals the written file
    assert [line.split(": ", 2)[2][:18] for line in _verdicts(capsys.readouterr().err)] == [
        "chunk 2/2 kept as "]  # --quiet: only the kept chunk's line


def test_busy_cores_lower_the_threads_and_the_command_says_so(tiny_model_dir, document, fake_replies, capsys,
                                                              monkeypatch):
    import torch

    from ngramspec.app import jobs

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(jobs, "runnable_elsewhere", lambda: 7)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    torch.set_num_threads(2)  # torch's choice on a 2-core machine (restored after the test)
    assert _main(_args(document, tiny_model_dir, "--keep-drifted", "0")) == 0
    err = capsys.readouterr().err
    assert "ngramspec rewrite: other processes keep cores busy: 1 torch thread (--threads N overrides)\n" in err
    assert torch.get_num_threads() == 1
    torch.set_num_threads(2)
    assert _main(_args(document, tiny_model_dir, "--keep-drifted", "0", "--threads", "2")) == 0
    assert "keep cores busy" not in capsys.readouterr().err and torch.get_num_threads() == 2


def test_a_pipe_gets_the_document_once_at_the_end(tiny_model_dir, document, fake_replies, capsys):
    fake_replies.reply = _fix_first_drift_second
    assert _main(_args(document, tiny_model_dir, "--quiet")) == 3
    assert capsys.readouterr().out == f"{FIXED}\n\n{SECOND}\n"


def test_stream_raw_shows_the_models_raw_output(tiny_model_dir, document, tmp_path, capsys, cache_env,
                                                monkeypatch):
    monkeypatch.setenv("NGRAMSPEC_CACHE", cache_env["NGRAMSPEC_CACHE"])
    out_file = tmp_path / "out.txt"
    code = _main(_args(document, tiny_model_dir, "--max-new-tokens", "8", "--stream-raw", "-o", str(out_file)))
    assert code == 3  # the tiny random model's garbage: every chunk kept
    raw = capsys.readouterr().out
    assert out_file.read_text() == document.read_text() and raw.strip() and FIRST not in raw
    assert _main(_args(document, tiny_model_dir, "--stream-raw", "--diff")) == 2
    assert "--stream-raw shows one document" in capsys.readouterr().err


def test_when_no_chunk_is_rewritten_one_line_names_the_cause_and_the_fix(tiny_model_dir, document, fake_replies,
                                                                          capsys):
    fake_replies.reply = lambda body: "Sure! Here is the text you asked for."
    assert _main(_args(document, tiny_model_dir, "--quiet")) == 3
    lines = [line for line in capsys.readouterr().err.splitlines() if "no chunk was rewritten" in line]
    assert lines == [f"ngramspec rewrite: no chunk was rewritten (all 2 kept as they were): model {tiny_model_dir} "
                     "is likely too small for this instruction; a larger instruct model usually manages, e.g. "
                     "--model Qwen/Qwen2.5-1.5B-Instruct"]
    fake_replies.reply = _fix_first_drift_second  # one chunk rewritten: no such line
    assert _main(_args(document, tiny_model_dir, "--quiet")) == 3
    assert "no chunk was rewritten" not in capsys.readouterr().err


@pytest.mark.parametrize("case", ["folder", "unwritable", "hard link", "same file", "out-dir folder"])
def test_output_paths_are_checked_before_the_model_loads(tiny_model_dir, document, tmp_path, case, capsys,
                                                         monkeypatch):
    from ngramspec.hf import models

    def load_model(*args, **kwargs):
        raise AssertionError("the model loaded before the output path was checked")

    monkeypatch.setattr(models, "load_model", load_model)
    (tmp_path / "folder").mkdir()
    os.link(document, tmp_path / "linked.txt")
    (tmp_path / "dir" / "in.txt").mkdir(parents=True)
    more, message = {
        "folder": (["-o", str(tmp_path / "folder")], f"-o {tmp_path / 'folder'} is a folder; give a file name "
                                                      f"(or --out-dir {tmp_path / 'folder'}: one output per input)"),
        "unwritable": (["-o", "/proc/ngramspec-out.txt"], "/proc/ngramspec-out.txt: cannot write in its folder /proc"),
        "hard link": (["-o", str(tmp_path / "linked.txt")], "the output would overwrite the input"),
        "same file": (["-o", str(tmp_path / "." / "in.txt")], "the output would overwrite the input"),
        "out-dir folder": (["--out-dir", str(tmp_path / "dir")],
                           f"--out-dir {tmp_path / 'dir' / 'in.txt'} is a folder"),
    }[case]
    assert _main(_args(document, tiny_model_dir, *more)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ngramspec rewrite: error: {message}") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "folder", "in.txt", "linked.txt"]


def test_usage_errors_come_before_torch_and_transformers_are_imported(tmp_path):
    """`-o DIR` and the other usage errors are answered without importing torch or transformers
    (seconds on a busy machine), let alone loading a model."""
    source = tmp_path / "in.txt"
    source.write_text("Some text.\n")
    code = ("import sys\nfrom ngramspec.app import cli\n"
            f"code = cli.main(['rewrite', {str(source)!r}, '--instruction', 'x', '-o', {str(tmp_path)!r}])\n"
            "heavy = sorted({'torch', 'transformers'} & set(sys.modules))\n"
            "print(code, heavy)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout == "2 []\n", done.stderr
    assert f"-o {tmp_path} is a folder" in done.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_act_as_ctrl_c_and_a_rerun_must_choose(tiny_model_dir, document, tmp_path, fake_replies,
                                                                  capsys, cache_env, signum):
    """The signal arrives while the second chunk is generated: exit 128 + signal, a message, no
    lock, the first chunk saved. A rerun without --resume refuses (before generating anything),
    naming --resume and --restart; --resume gives the bytes of an uninterrupted run."""

    def reply(body):
        if "second" in body and len(fake_replies.seen) == 2:
            os.kill(os.getpid(), signum)
        return body.replace("Teh", "The")

    fake_replies.reply = reply
    out_file = tmp_path / "out.txt"
    args = _args(document, tiny_model_dir, "-o", str(out_file), "--quiet")
    assert _main(args) == 128 + signum
    err = capsys.readouterr().err
    assert f"interrupted ({signal.Signals(signum).name}); the input is untouched and no output was written" in err
    assert "--resume" in err and not out_file.exists() and not (tmp_path / ".out.txt.lock").exists()
    assert signal.getsignal(signum) is signal.SIG_DFL or signum == signal.SIGHUP  # handlers restored

    seen = len(fake_replies.seen)
    assert _main(args) == 2
    assert capsys.readouterr().err == (f"ngramspec rewrite: error: {document}: an earlier run of this command saved "
                                       "1 finished chunk(s); rerun with --resume to continue from them, or "
                                       "--restart to discard them and start over\n")
    assert len(fake_replies.seen) == seen and not out_file.exists()  # refused before any generation
    assert _main(args + ["--resume", "--restart"]) == 2
    assert _main(args + ["--resume", "--stats"]) == 0
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert (stats["chunks"], stats["resumed_chunks"]) == (2, 1)  # the report counts the resumed chunk
    assert len(fake_replies.seen) == seen + 1  # only the second chunk was generated again
    assert out_file.read_text() == f"{FIXED}\n\n{SECOND.replace('Teh', 'The')}\n"
    assert not any((Path(cache_env["NGRAMSPEC_CACHE"]) / "resume").iterdir())  # state removed after success


def test_restart_discards_saved_chunks_and_a_resumed_kept_chunk_still_counts(tiny_model_dir, document, tmp_path,
                                                                             fake_replies, capsys):
    def reply(body):
        if "second" in body:
            raise KeyboardInterrupt
        return "Something else entirely."  # the first chunk drifts: kept

    fake_replies.reply = reply
    args = _args(document, tiny_model_dir, "-o", str(tmp_path / "out.txt"), "--quiet", "--stats")
    assert _main(args) == 130
    fake_replies.reply = lambda body: body.replace("Teh", "The")
    assert _main(args + ["--resume"]) == 3  # the chunk kept by the first run still makes it exit 3
    err = capsys.readouterr().err
    assert f"{document}: chunk 1/2 resumed from an earlier run, kept as it was: its rewrite drifted (" in err
    stats = json.loads(err.strip().splitlines()[-1])
    assert (stats["chunks"], stats["resumed_chunks"], stats["guarded_chunks"]) == (2, 1, 1)
    assert (tmp_path / "out.txt").read_text() == f"{FIRST}\n\n{SECOND.replace('Teh', 'The')}\n"

    fake_replies.reply = reply
    assert _main(args) == 130
    fake_replies.reply = lambda body: body.replace("Teh", "The")
    assert _main(args + ["--restart"]) == 0  # both chunks generated again
    assert (tmp_path / "out.txt").read_text() == f"{FIXED}\n\n{SECOND.replace('Teh', 'The')}\n"


def test_a_looping_summary_is_refused_unless_accept_loops(tiny_model_dir, tmp_path, cache_env, monkeypatch, capsys):
    from ngramspec.app.documents import DocumentJob

    def looping(self, ids, max_new_tokens, source=None):
        self.last_stop = "loop"
        return "GLIB-1.1.0-1.1.0-1.1.0-1.1.0"

    monkeypatch.setattr(DocumentJob, "generate", looping)
    monkeypatch.setenv("NGRAMSPEC_CACHE", cache_env["NGRAMSPEC_CACHE"])
    source = tmp_path / "README.md"
    source.write_text("# GLib\n\nGLib is the low-level core library that forms the basis for projects.\n")
    out = tmp_path / "summary.txt"
    args = ["summarize", str(source), "--model", str(tiny_model_dir), "--quiet", "-o", str(out)]
    assert _main(args) == 4
    err = capsys.readouterr().err
    assert "summary refused, nothing written: the model's summary repeated itself" in err
    assert err.rstrip().endswith("; --accept-loops writes it anyway")  # named in the refusal
    assert not out.exists()
    assert _main(args + ["--restart", "--accept-loops"]) == 0
    assert out.read_text() == "GLIB-1.1.0-1.1.0-1.1.0-1.1.0\n"


def test_help_fits_one_screen_with_each_default_once_and_help_all_lists_every_option(capsys, monkeypatch):
    from ngramspec.app import cli
    from ngramspec.app.options import COMMON

    monkeypatch.setenv("COLUMNS", "100")
    for command in ("rewrite", "summarize"):
        code, out = _help(cli, [command, "--help"], capsys)
        assert code == 0 and len(out.splitlines()) <= 40, out
        common = [flag for flag in COMMON if command == "rewrite" or flag not in ("--diff", "--keep-drifted",
                                                                                    "--max-growth")]
        for flag in common + ["--help-all"]:
            assert re.search(rf"^  (-o OUTPUT, )?{flag}\b", out, flags=re.M), flag
        assert "--max-draft-tokens" not in out and "--cost-tuning" not in out and "(default: None)" not in out
        code, full = _help(cli, [command, "--help-all"], capsys)
        assert code == 0
        parser = next(a for a in cli.build_parser(full=True)._actions if a.dest == "command").choices[command]
        for action in parser._actions:
            for flag in action.option_strings:
                assert re.search(rf"(^|[ ,]){re.escape(flag)}\b", full, flags=re.M), flag
        for help_text in (out, full):
            for entry in re.split(r"\n  (?=-)", help_text):  # one option's help
                assert entry.count("(default") <= 1, entry
                assert "(default: None)" not in entry and "(default: [])" not in entry


def _help(cli, args, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        cli.main(args)
    return exit_.value.code, capsys.readouterr().out


def test_every_speculation_setting_is_reachable_through_set_and_config(tmp_path):
    """--set NAME=VALUE, --config FILE and a setting's own option go through the same settings
    parser; later ones override earlier ones, and a bad one is a usage error naming it."""
    from ngramspec.app.cli import _speculator_config, build_parser
    from ngramspec.app.process import CliError
    from ngramspec.draft.config import SpeculatorConfig, parse_config, setting_fields

    parser = build_parser()
    base = ["rewrite", "in.txt", "--instruction", "x"]
    for name, (_, f) in setting_fields().items():  # a value other than the default, as text
        if isinstance(f.default, bool):
            text = str(not f.default).lower()
        elif isinstance(f.default, int):
            text = str(f.default + 1)
        elif isinstance(f.default, float):
            text = str(f.default * 2 if f.default >= 1 else f.default / 2 if f.default else 0.25)
        elif name == "match":
            text = "earliest" if SpeculatorConfig().match != "earliest" else "recent"
        elif name == "max_loss":  # off by default
            text = "0.02"
        else:
            text = "1:1.0,8:1.5"
        needs = {"self_draft_only": "self_draft_layers=2"}.get(name)  # a setting that needs another one
        expected = parse_config(",".join(filter(None, [needs, f"{name}={text}"])))
        assert expected != SpeculatorConfig(), name
        given = (["--set", needs] if needs else []) + ["--set", f"{name}={text}"]
        assert _speculator_config(parser.parse_args(base + given)) == expected, name
    config_file = tmp_path / "spec.conf"
    config_file.write_text("# my settings\nmax_draft_tokens=12  # longer drafts\nverify_cost=1:1.0,8:1.5\n")
    config = _speculator_config(parser.parse_args(base + ["--config", str(config_file), "--set", "min_n=2"]))
    assert (config.max_draft_tokens, config.verify_cost, config.min_n) == (12, ((1, 1.0), (8, 1.5)), 2)
    config = _speculator_config(parser.parse_args(base + ["--config", str(config_file), "--max-draft-tokens", "4"]))
    assert config.max_draft_tokens == 4  # an option overrides the file
    for bad, message in ((["--set", "min_n"], "--set takes NAME=VALUE"), (["--set", "nope=1"], "nope"),
                         (["--config", str(tmp_path / "missing")], "No such file")):
        with pytest.raises(CliError, match=message):
            _speculator_config(parser.parse_args(base + bad))


@pytest.mark.slow  # two CLI processes in a pseudo-terminal
@pytest.mark.parametrize("guard", ["0.8", "0"])  # the tiny model's chunks: all kept / all rewritten
def test_in_a_pseudo_terminal_stdout_equals_the_written_file(tiny_model_dir, tmp_path, cache_env, guard):
    import pty
    import termios

    source = tmp_path / "doc.md"
    source.write_text("# Notes\n\nA first paragraph, with a few words.\n\n- an item\n- another item\n\nThe end.\n")
    args = [sys.executable, "-m", "ngramspec", *_args(source, tiny_model_dir, "--max-new-tokens", "10",
                                                       "--keep-drifted", guard)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **cache_env}
    master, slave = pty.openpty()
    attributes = termios.tcgetattr(slave)
    attributes[1] &= ~termios.OPOST  # no LF -> CRLF translation: the bytes as written
    termios.tcsetattr(slave, termios.TCSANOW, attributes)
    process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    os.close(slave)
    shown = b""
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the terminal's other end closed
            break
        if not data:
            break
        shown += data
    _, err = process.communicate(timeout=300)
    os.close(master)
    assert process.returncode == (3 if guard != "0" else 0), err.decode()
    written = tmp_path / "out.md"
    done = subprocess.run(args + ["-o", str(written)], cwd=ROOT, env=env, capture_output=True, timeout=300)
    assert done.returncode == process.returncode, done.stderr.decode()
    assert shown == written.read_bytes()
    assert (shown == source.read_bytes()) == (guard != "0")  # kept: the source; rewritten: something else
