"""Torch CPU threads under load: the `ngramspec rewrite` command on one fixed chunk, timed for
each thread setting, on the machine as it is and with K busy processes added.

    python -m eval threads --settings default,1,2,passive --repeats 3 --load 0,2 --out DIR

Each run is a fresh `python -m ngramspec rewrite ... --stats` process (so thread counts and
OpenMP's environment apply from the start); its time is the generation seconds --stats reports
(model loading excluded). Settings: ``default`` (the command's own choice), ``torch`` (torch's
choice, every core), an integer (``--threads N``), ``passive`` (torch's choice with
OMP_WAIT_POLICY=PASSIVE). ``--load K`` adds K processes that spin on a core for the duration of
the runs (0: the machine as it is, whatever else it runs). The report gives each setting's
median and its ratio to the best fixed ``--threads`` value under the same load. Never a timed
test: the numbers depend on the machine and on what else it runs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENT = (
    "The release notes for this version list the changes made since the last one. The parser now "
    "accepts files with a byte-order mark, and the command line reports a missing input file with one "
    "line instead of a traceback. Two bugs were fixed in the cache: entries written by an older version "
    "are read again, and a full disk no longer leaves a half-written entry behind. The documentation "
    "gained a section on running the tool over many files at once, with examples for a folder of "
    "Markdown notes and for a source tree. Teh default settings did not change, so existing scripts run "
    "as they did, and teh output of every command is the same as before for the same input.\n")


def add_arguments(parser) -> None:
    parser.add_argument("--settings", default="default,torch,1,2,passive",
                        help="comma-separated: default, torch, passive or a thread count")
    parser.add_argument("--load", default="0", help="comma-separated numbers of busy processes to add")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--model", default="default")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    parser.add_argument("--out", default=None, help="folder for results.json and report.md")


def _spin() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def one_run(setting: str, document: Path, args) -> float:
    """Generation seconds of one command run with ``setting``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("OMP_NUM_THREADS", None)
    command = [sys.executable, "-m", "ngramspec", "rewrite", str(document), "--instruction", "Fix the typos.",
               "-o", os.devnull, "--quiet", "--stats", "--keep-drifted", "0", "--model", args.model,
               "--max-new-tokens", str(args.max_new_tokens)]
    if setting == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif setting == "torch":
        command += ["--threads", str(_torch_threads())]
    elif setting != "default":
        command += ["--threads", setting]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode not in (0, 3):
        raise RuntimeError(f"{setting}: exit {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stderr.strip().splitlines()[-1])["seconds"]


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def main(args) -> int:
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    loads = [int(k) for k in args.load.split(",")]
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    document = (out or Path("/tmp")) / "threads-document.txt"
    document.write_text(DOCUMENT)
    rows = []
    for load in loads:
        spinners = [_spin() for _ in range(load)]
        try:
            time.sleep(1.0 if load else 0.0)
            for repeat in range(args.repeats):
                for setting in settings:  # interleaved, so a change in the machine's load hits all
                    seconds = one_run(setting, document, args)
                    rows.append({"load": load, "setting": setting, "repeat": repeat, "seconds": seconds,
                                 "loadavg_1min": round(os.getloadavg()[0], 2)})
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
    report = _report(rows, args)
    print(report)
    if out:
        (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
        (out / "report.md").write_text(report)
    return 0


def _report(rows: list[dict], args) -> str:
    lines = [f"Command: `python -m eval threads --settings {args.settings} --load {args.load} --repeats "
             f"{args.repeats} --max-new-tokens {args.max_new_tokens}`; {os.cpu_count()} cores.", "",
             "| added load | setting | median s | runs | vs best fixed --threads | load average (1 min) |",
             "|---|---|---|---|---|---|"]
    for load in sorted({r["load"] for r in rows}):
        here = [r for r in rows if r["load"] == load]
        medians = {s: statistics.median(r["seconds"] for r in here if r["setting"] == s)
                   for s in dict.fromkeys(r["setting"] for r in here)}
        fixed = [m for s, m in medians.items() if s.isdigit()]
        best = min(fixed) if fixed else None
        for setting, median in medians.items():
            runs = [r for r in here if r["setting"] == setting]
            ratio = f"{median / best:.2f}x" if best else "-"
            lines.append(f"| {load} | {setting} | {median:.2f} | {len(runs)} | {ratio} | "
                         f"{statistics.mean(r['loadavg_1min'] for r in runs):.1f} |")
    return "\n".join(lines) + "\n"
