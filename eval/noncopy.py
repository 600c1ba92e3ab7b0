"""`python -m eval noncopy`: the worst case for a copying drafter, a prompt with nothing to copy.

Each prompt is the chat template around a user message of ``--prompt-tokens`` token ids drawn
uniformly (seeded) from the model's vocabulary, decoded to text, then ``--instruction``: a task
whose answer is new text, so any match the index finds is chance. (Random ids fed raw, with no
instruction, make a small model loop, and a loop is copied: the opposite of the worst case.)
Greedy then decodes ``--max-new-tokens`` tokens with
plain ``generate()`` and with ``ngram_speculator=NgramSpeculator(...)`` (``--settings`` as for
the other commands), each side timed ``--rounds`` times in alternating order. A ratio is plain's
best time over ngramspec's best on the same prompt; the outputs must be identical. Alongside:
MAT, the steps that drafted and those whose match sizing declined, and the draft tokens
verified and accepted, so a ratio below 1 shows where its cost came from. Never a timed test.

    python -m eval noncopy --prompt-tokens 256,1024,2048 --rounds 3 --out eval/results/noncopy
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .options import add_options


def add_arguments(parser) -> None:
    add_options(parser, "model", "threads", "settings")
    parser.add_argument("--prompt-tokens", default="256,1024,2048", help="comma-separated prompt lengths")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3, help="timed runs per side, alternating; each side's best")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--instruction", default="Ignore the text above. Write a short story about a lighthouse "
                                                  "keeper who finds a message in a bottle.",
                        help="what the user asks after the random text")
    parser.add_argument("--out", default=None, help="folder for report.md and results.json")


def measure(model, prompt, max_new_tokens: int, rounds: int, config) -> dict:
    """Plain greedy against ngramspec on one prompt (1, P): each side's best of ``rounds``."""
    import torch

    from ngramspec import NgramSpeculator

    speculator = NgramSpeculator(config)
    kwargs = dict(do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens)
    best, outputs, stats = {"plain": float("inf"), "ngramspec": float("inf")}, {}, None
    with torch.inference_mode():
        model.generate(prompt, ngram_speculator=speculator, **kwargs)  # untimed: the cost model's first look
        for r in range(rounds):
            for side in (("plain", "ngramspec") if r % 2 == 0 else ("ngramspec", "plain")):
                extra = {"ngram_speculator": speculator} if side == "ngramspec" else {}
                started = time.perf_counter()
                out = model.generate(prompt, **kwargs, **extra)
                best[side] = min(best[side], time.perf_counter() - started)
                outputs[side] = out[0, prompt.shape[1]:].tolist()
                if side == "ngramspec":
                    stats = speculator.last_stats
    return {"prompt_tokens": int(prompt.shape[1]), "plain_s": best["plain"], "ngramspec_s": best["ngramspec"],
            "ratio": best["plain"] / best["ngramspec"], "identical": outputs["plain"] == outputs["ngramspec"],
            "mat": stats.mat, "steps_with_draft": stats.steps_with_draft, "declined_steps": stats.declined_steps,
            "drafted": stats.drafted_tokens, "accepted": stats.accepted_tokens,
            "forwards": stats.target_forwards, "output": outputs["plain"]}


def main(args) -> int:
    import torch

    from ngramspec import load_model
    from ngramspec.draft.config import parse_config

    if args.threads:
        torch.set_num_threads(args.threads)
    config = parse_config(args.settings)
    model, tokenizer = load_model(args.model)
    generator = torch.Generator().manual_seed(args.seed)
    rows = []
    for n in (int(x) for x in args.prompt_tokens.split(",")):
        ids = torch.randint(0, len(tokenizer), (n,), generator=generator).tolist()
        text = tokenizer.decode(ids, skip_special_tokens=True) + "\n\n" + args.instruction
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)["input_ids"]
        row = measure(model, prompt, args.max_new_tokens, args.rounds, config)
        row["random_tokens"] = n
        row["text"] = tokenizer.decode(row.pop("output"))
        rows.append(row)
        print(f"{n} random tokens ({row['prompt_tokens']} in the prompt): ngramspec {row['ratio']:.2f}x plain "
              f"(plain {row['plain_s']:.2f} s), "
              f"MAT {row['mat']:.2f}, {row['steps_with_draft']} steps drafted, {row['declined_steps']} declined, "
              f"{row['accepted']}/{row['drafted']} draft tokens accepted, identical: {row['identical']}", flush=True)
    command = "python -m eval noncopy " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in (("prompt_tokens", args.prompt_tokens),
                                                    ("max_new_tokens", args.max_new_tokens),
                                                    ("rounds", args.rounds), ("threads", args.threads),
                                                    ("settings", args.settings)) if v)
    lines = [f"Command: `{command}`; torch {torch.__version__}, {torch.get_num_threads()} torch threads, "
             f"model {args.model}, settings {args.settings or 'default'}.", "",
             "| random tokens | prompt tokens | plain s (best) | ngramspec x plain | MAT | steps drafted | declined | "
             "draft tokens accepted/verified | identical |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['random_tokens']} | {r['prompt_tokens']} | {r['plain_s']:.2f} | {r['ratio']:.2f}x | "
              f"{r['mat']:.2f} | {r['steps_with_draft']} | {r['declined_steps']} | {r['accepted']}/{r['drafted']} | "
              f"{'yes' if r['identical'] else 'NO'} |" for r in rows]
    lines += ["", "What greedy wrote (the first 300 characters of each):", ""]
    lines += [f"- {r['random_tokens']}: {r['text'][:300]!r}" for r in rows]
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text("\n".join(lines) + "\n")
        (out / "results.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1) + "\n")
    return 0 if all(r["identical"] for r in rows) else 1
