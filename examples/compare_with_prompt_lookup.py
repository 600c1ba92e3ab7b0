"""Side-by-side timing on one input: plain greedy, transformers' prompt lookup, ngramspec.

    python examples/compare_with_prompt_lookup.py [FILE] [--threads 2]

Runs each method twice (the first run warms up) and reports the second: seconds, tokens/s and
whether the output equals plain greedy. (`python -m eval bench` does this over many items.)
"""

import argparse
import time

import torch

import ngramspec

SAMPLE = """def mean(values):
    total = 0
    for v in values:
        total += v
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for v in values:
        total += (v - m) ** 2
    return total / len(values)
"""

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("file", nargs="?", help="text or code to rewrite (default: a small Python sample)")
parser.add_argument("--instruction", default="Add a docstring to every function. Return the whole code.")
parser.add_argument("--max-new-tokens", type=int, default=256)
parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
args = parser.parse_args()
if args.threads:
    torch.set_num_threads(args.threads)

source = open(args.file, encoding="utf-8").read() if args.file else SAMPLE
model, tokenizer = ngramspec.load_model()
messages = [{"role": "user", "content": f"{args.instruction}\n\n{source}"}]
ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
ids = ids["input_ids"]
methods = {
    "plain greedy": {},
    "prompt_lookup_num_tokens=10": {"prompt_lookup_num_tokens": 10},
    "ngramspec": {"ngram_speculator": ngramspec.NgramSpeculator()},
}
print(f"torch threads: {torch.get_num_threads()}, prompt {ids.shape[1]} tokens")
reference = None
for name, extra in methods.items():
    for _ in range(2):  # warm-up, then the timed run
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False, **extra)
        seconds = time.perf_counter() - start
    new = out[0, ids.shape[1]:].tolist()
    reference = reference or new
    print(f"{name:>28}: {seconds:6.2f} s, {len(new) / seconds:6.1f} tok/s, identical to greedy: {new == reference}")
