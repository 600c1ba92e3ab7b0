"""Mutation check of the test suite: each known bug is planted in the source, the tests that
must catch it run, the source is restored; every mutant must make them fail.

    python tests/mutants.py            # all mutants (about 2 minutes on 2 cores)
    python tests/mutants.py crop       # one

The decode-loop mutants (a wrong crop, unmasked holes, positions that count holes, the wrong
tree columns, no crop after a stop) must fail tests/test_decode.py; a sampler that draws again
from p after a rejection (so the draft token gets extra mass) must fail tests/test_sampling.py.
Exit status 1 when a mutant survives.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DECODE, VERIFY, WALK = "ngramspec/hf/decode.py", "ngramspec/hf/verify.py", "ngramspec/draft/walk.py"
# name: (file, original text, mutated text, tests that must fail), or (file, [(original, mutated) or
# (another file, original, mutated), ...], tests that must fail)
MUTANTS = {
    "crop": (DECODE, "            target.crop(q - width)\n", "            target.crop(max(q - width - 1, 0))\n",
             "tests/test_decode.py"),
    "hole masking": (DECODE, "            self.mask = torch.cat([self.mask, step], 1)\n",
                     "            self.mask = torch.cat([self.mask, torch.ones_like(step)], 1)\n",
                     "tests/test_decode.py"),
    "positions": (DECODE, "        self.next_position = [p + n + 1 for p, n in zip(self.next_position, kept)]\n",
                  "        self.next_position = [p + width for p in self.next_position]\n", "tests/test_decode.py"),
    "tree gather": (DECODE, "            rows = verify.block_rows(verdicts[0].path)\n",
                    "            rows = list(range(len(verdicts[0].path) + 1))\n", "tests/test_decode.py"),
    "stop crop": (DECODE, "                target.crop(rows.cut)\n", "                target.crop(0)\n",
                  "tests/test_decode.py"),
    # A sampler that, after a rejection, draws the position again with a fresh uniform (so the
    # draft token gets extra mass): the redraw in follow(), and uniforms no longer fixed per
    # position (else the redraw would repeat the same draw).
    "biased sampler": (VERIFY, [
        (WALK, "        node = children.get((node, token), None)\n        if node is None:\n",
         "        previous, node = node, children.get((node, token), None)\n        if node is None:\n"
         "            if any(parent == previous for parent, _ in children):  # rejected: draw again\n"
         "                emitted[-1] = choice(previous + 1, emitted[:-1])\n"),
        ("        drawn = self.drawn[b]\n",
         "        return torch.rand((), dtype=torch.float64).item()\n        drawn = self.drawn[b]\n"),
    ], "tests/test_sampling.py"),
}


def run(name: str) -> bool:
    """True when the mutant is caught (its tests fail)."""
    path, *change, tests = MUTANTS[name]
    replacements = change[0] if len(change) == 1 else [tuple(change)]  # one (original, mutated) or a list
    sources: dict[Path, str] = {}  # every file changed, as it was
    try:
        for replacement in replacements:
            file, original, mutated = replacement if len(replacement) == 3 else (path, *replacement)
            source_file = ROOT / file
            mutant = source_file.read_text()
            sources.setdefault(source_file, mutant)
            assert mutant.count(original) == 1, f"{name}: the original text is not in {file} exactly once"
            source_file.write_text(mutant.replace(original, mutated))
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-n", "auto", "-p", "no:cacheprovider",
                               tests], cwd=ROOT, capture_output=True, text=True)
    finally:
        for source_file, source in sources.items():
            source_file.write_text(source)
    summary = [line for line in done.stdout.splitlines() if " passed" in line or " failed" in line]
    print(f"{name}: {'caught' if done.returncode else 'SURVIVED'} ({summary[-1] if summary else 'no summary'})")
    for line in done.stdout.splitlines():
        if line.startswith("FAILED"):
            print("   ", line.split(" - ")[0])
    return done.returncode != 0


if __name__ == "__main__":
    names = sys.argv[1:] or list(MUTANTS)
    sys.exit(0 if all([run(name) for name in names]) else 1)
