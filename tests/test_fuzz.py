"""The differential fuzzer (tests/fuzz.py): 500 random cases agree with plain generate(), and
the fuzzer really catches a faulty verifier."""

import fuzz
import pytest

SHARES = 4  # the 500 cases in four shares, so parallel test workers split them


@pytest.mark.slow
@pytest.mark.parametrize("share", range(SHARES))
def test_500_random_cases_match_plain_generate(capsys, share):
    cases = 500 // SHARES
    code = fuzz.main(["--cases", str(cases), "--first", str(share * cases), "--seed", "0", "--quiet"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == f"{cases} cases, 0 mismatches", "\n".join(line for line in lines if line.startswith("MISMATCH"))
    assert code == 0


def test_the_fuzzer_catches_an_injected_fault(capsys):
    """--inject-fault makes the verifier keep the first rejected draft token of each case (a
    wrong token emitted): greedy cases with a rejection must be reported, each with a line that
    reproduces it, and the exit code says so."""
    code = fuzz.main(["--cases", "20", "--seed", "0", "--quiet", "--inject-fault"])
    lines = capsys.readouterr().out.strip().splitlines()
    reported = [line for line in lines if line.startswith("MISMATCH: python tests/fuzz.py --cases 1 --seed 0 --case ")]
    assert code == 1 and len(reported) >= 5
    assert lines[-1] == f"20 cases, {len(reported)} mismatches"
    # The fault is switched off again after each case: the same cases then pass.
    assert fuzz.main(["--cases", "20", "--seed", "0", "--quiet"]) == 0


def test_one_case_is_reproducible_alone(capsys):
    """--case K runs exactly case K of the seed, drawn from (seed, K) alone."""
    assert fuzz.draw_case(3, 7) == fuzz.draw_case(3, 7) != fuzz.draw_case(3, 8)
    assert fuzz.main(["--cases", "1", "--seed", "3", "--case", "7", "--quiet"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "1 cases, 0 mismatches"


def test_an_exception_passes_only_as_plain_generate_s_own(monkeypatch):
    """Where the speculator raises, plain generate() on the same request must raise the same
    exception: the same type and the same message (the same condition), not just the type."""
    assert fuzz.error_mismatch(ValueError("row 0 has no token left"), ValueError("row 0 has no token left")) is None
    problem = fuzz.error_mismatch(ValueError("x"), ValueError("another"))
    assert problem == "ValueError: x, but plain generate() raised ValueError: another"
    assert fuzz.error_mismatch(ValueError("x"), TypeError("x"))
    # In a case: the speculator's step fails with a message plain generate()'s failure does not share.
    from ngramspec.hf import verify

    def fails(message):
        def raising(*args, **kwargs):
            raise RuntimeError(message)
        return raising

    index = next(k for k in range(100) if not fuzz.draw_case(0, k)["extras"]["refused"])
    monkeypatch.setattr(verify, "verify_step", fails("probability tensor contains inf"))
    monkeypatch.setattr(fuzz, "plain_generate", fails("probability tensor contains inf"))
    assert fuzz.run_case(0, index)[0] is None  # the same failure as plain generate()'s: no mismatch
    monkeypatch.setattr(fuzz, "plain_generate", fails("CUDA out of memory"))
    problem = fuzz.run_case(0, index)[0]
    assert problem and "probability tensor contains inf" in problem and "CUDA out of memory" in problem, problem
