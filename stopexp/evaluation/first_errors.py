"""When paths go wrong: where the first wrong intermediate value of each path appears (the
bank's `first_wrong_value`, tasks with intermediate values), against its outcome.

Read as the seed's premise: if most failing paths write their first wrong value early,
a check early in the path can in principle know (error_oracle is that ceiling); if they
go wrong late, no early check can."""
from __future__ import annotations

import numpy as np

EARLY = (0.2, 0.5)  # shares of a path's length


def error_timing(length, correct, first_wrong, checks=()) -> dict:
    """Over paths with `length` tokens, outcome `correct` and first wrong value ending at
    token `first_wrong` (-1: none; all (P,)): per share s of EARLY, the share of failing
    paths whose first wrong value lies within the first s of their tokens
    (``failing_error_within``); the accuracy of paths with such an early error and of those
    without (``accuracy_early_error`` / ``accuracy_no_early_error``, None where no path is
    in the group, with the group sizes); the same for any wrong value; and per check
    (tokens) the share of failing paths that show their wrong value by then."""
    n = np.asarray(length, dtype=np.int64)
    ok = np.asarray(correct, dtype=bool)
    at = np.asarray(first_wrong, dtype=np.int64)
    wrong = at >= 0
    failing = ~ok

    def share(mask, within):
        return _ratio(int((mask & within).sum()), int(within.sum()))

    out = {"paths": int(len(n)), "failing": int(failing.sum()),
           "failing_with_wrong_value": share(wrong, failing),
           "correct_with_wrong_value": share(wrong, ok),
           "accuracy_wrong_value": share(ok, wrong), "accuracy_no_wrong_value": share(ok, ~wrong),
           "failing_error_within": {}, "accuracy_early_error": {}, "accuracy_no_early_error": {},
           "early_error_paths": {}}
    for s in EARLY:
        early = wrong & (at <= s * n)
        key = f"{round(100 * s)}%"
        out["failing_error_within"][key] = share(early, failing)
        out["accuracy_early_error"][key] = share(ok, early)
        out["accuracy_no_early_error"][key] = share(ok, ~early)
        out["early_error_paths"][key] = int(early.sum())
    out["failing_error_by_check"] = {str(int(c)): share(wrong & (at <= c), failing) for c in checks}
    return out


def bank_timing(ds, checks=()) -> dict:
    """`error_timing` of the paths of a bank split (`stopexp.store.bank.load_bank`)."""
    return error_timing(ds["length"][:], ds["correct"][:], ds["first_wrong_value"][:], checks)


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 4) if b else None


def timing_lines(timing: dict) -> list[str]:
    """The printed summary of `error_timing`."""
    f = timing["failing_error_within"]
    lines = [f"first wrong intermediate value: {timing['failing']} of {timing['paths']} paths "
             f"fail; of those, {_pct(timing['failing_with_wrong_value'])} write a wrong value, "
             + ", ".join(f"{_pct(v)} within the first {k} of the path" for k, v in f.items())
             + (", " + ", ".join(f"{_pct(v)} by {c} tokens" for c, v in
                                 timing["failing_error_by_check"].items())
                if timing["failing_error_by_check"] else "")]
    for k in f:
        lines.append(f"  accuracy with a wrong value in the first {k}: "
                     f"{_num(timing['accuracy_early_error'][k])} ({timing['early_error_paths'][k]} "
                     f"paths), without: {_num(timing['accuracy_no_early_error'][k])}")
    lines.append(f"  accuracy with any wrong value: {_num(timing['accuracy_wrong_value'])}, with "
                 f"none: {_num(timing['accuracy_no_wrong_value'])}")
    return lines


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x) -> str:
    return "-" if x is None else f"{x:.3f}"
