"""The report of online adaptation (python -m stopexp.adapt): per variant, a summary of
its learning curves (stopexp.training.stream.run_stream's records, one per batch) and the
console table of those summaries.

Per batch a record holds the within-prompt AUROC of the scores that pruned it, the vote
accuracy, the tokens (exploration and Monte Carlo rollouts included), the estimated wall
seconds (tokens x the bank's seconds per token, plus the measured check and update time),
and the within-prompt AUROC on the held-out prompts after the update (the cleaner
learning curve)."""
from __future__ import annotations

import math

import numpy as np

from stopexp.core.names import ONLINE_VARIANTS
from stopexp.core.policies import kept_text
from stopexp.metrics import bootstrap_over_groups, paired_difference
from stopexp.metrics.multiplicity import correct_family, holm_note, holm_text


def summarize_variants(curves: dict, last: int = 5, held_aurocs: dict | None = None,
                       n_boot: int = 1000, seed: int = 0) -> dict:
    """Per variant: accuracy and tokens over the stream, the tokens' share of no_prune's,
    the mean AUROC of the last `last` batches, the final held-out AUROC, and (for the
    online variants) the share of the frozen -> retrained held-out AUROC gap closed at the
    end and the prompts seen when half of it first was. With `held_aurocs` (variant -> each
    held-out prompt's AUROC under its final predictor), each variant's paired held-out
    difference to frozen (`heldout_vs_frozen`) and the gap closed's interval
    (`gap_closed_ci`), over `n_boot` resamples of the held-out prompts from `seed`, or
    `no_gap` (`add_gap_intervals`)."""
    out = {}
    for v, recs in curves.items():
        w = np.asarray([r["prompts_seen"] - (recs[i - 1]["prompts_seen"] if i else 0)
                        for i, r in enumerate(recs)], float)
        out[v] = {"accuracy": float(np.average([r["accuracy"] for r in recs], weights=w)),
                  "tokens_total": float(sum(r["tokens"] for r in recs)),
                  "explore_tokens": float(sum(r["explore_tokens"] for r in recs)),
                  "mc_tokens": float(sum(r.get("mc_tokens", 0.0) for r in recs)),
                  "wall_s": float(sum(r["wall_s"] for r in recs)),
                  "update_s": float(sum(r["update_s"] for r in recs)),
                  "auroc_last": float(np.nanmean([r["auroc"] for r in recs[-last:]]))
                  if any(np.isfinite(r["auroc"]) for r in recs[-last:]) else math.nan,
                  "heldout_auroc": recs[-1].get("heldout_auroc", math.nan)}
    if "no_prune" in out:
        for s in out.values():
            s["tokens_ratio"] = s["tokens_total"] / out["no_prune"]["tokens_total"]
    if "frozen" in out and "retrained" in out:
        lo, hi = out["frozen"]["heldout_auroc"], out["retrained"]["heldout_auroc"]
        for v in ONLINE_VARIANTS:
            if v in out and hi != lo:
                out[v]["gap_closed"] = (out[v]["heldout_auroc"] - lo) / (hi - lo)
                half = [r["prompts_seen"] for r in curves[v]
                        if (r["heldout_auroc"] - lo) / (hi - lo) >= 0.5]
                out[v]["prompts_to_half_gap"] = half[0] if half else None
    if held_aurocs and "frozen" in held_aurocs:
        add_gap_intervals(out, {v: np.asarray(x, float) for v, x in held_aurocs.items()},
                          n_boot, seed)
    return out


def add_gap_intervals(out: dict, per_prompt: dict, n_boot: int, seed: int) -> None:
    """Into `out` (summarize_variants'): per variant with held-out AUROCs per prompt
    (`per_prompt`: variant -> (prompts,), NaN where a prompt's paths share one outcome, the
    same prompts for every variant) the paired difference to frozen (Holm-corrected over
    the variants: one family) and, where `out` has a
    gap closed, its percentile interval over the prompts that all three rank (a ratio:
    wide when the gap, retrained's `heldout_vs_frozen`, is near 0). Where that gap's interval
    is not above 0 the online variants get `no_gap` instead of a share, its interval and
    `prompts_to_half_gap`: a share of no gap (or of a negative one) means nothing."""
    frozen, ceiling = per_prompt["frozen"], per_prompt.get("retrained")
    for v, values in per_prompt.items():
        if v != "frozen":
            out[v]["heldout_vs_frozen"] = paired_difference(values, frozen, n_boot, seed)
    correct_family([out[v]["heldout_vs_frozen"] for v in per_prompt if v != "frozen"])
    gap = out.get("retrained", {}).get("heldout_vs_frozen")
    if gap is not None and not gap["ci"][0] > 0:
        for v in ONLINE_VARIANTS:
            if v in out:
                out[v].pop("gap_closed", None)
                out[v].pop("prompts_to_half_gap", None)
                out[v]["no_gap"] = True
    for v, values in per_prompt.items():
        if ceiling is None or "gap_closed" not in out[v]:  # no gap (or not an online variant)
            continue
        both = ~(np.isnan(values) | np.isnan(frozen) | np.isnan(ceiling))
        a, f, r = values[both], frozen[both], ceiling[both]

        def closed(idx, a=a, f=f, r=r):
            gap = r[idx].mean() - f[idx].mean()
            return (a[idx].mean() - f[idx].mean()) / gap if gap else math.nan

        if both.any():
            ci = bootstrap_over_groups(closed, np.arange(both.sum()), n_boot, seed)
            out[v]["gap_closed_ci"] = list(ci)
            out[v]["gap_closed_nan_resamples"] = ci.nan_resamples  # resamples without a gap


def flat_summary(s: dict) -> dict:
    """A variant's summary as scalars, for the tracker: the paired difference's mean,
    bounds and prompt count, an interval's bounds (`_lo`, `_hi`)."""
    out = {k: x for k, x in s.items() if isinstance(x, (int, float))}
    if "heldout_vs_frozen" in s:
        d = s["heldout_vs_frozen"]
        out.update({"heldout_vs_frozen": d["diff"], "heldout_vs_frozen_lo": d["ci"][0],
                    "heldout_vs_frozen_hi": d["ci"][1], "heldout_vs_frozen_prompts": d["prompts"]})
    if "gap_closed_ci" in s:
        out.update({"gap_closed_lo": s["gap_closed_ci"][0], "gap_closed_hi": s["gap_closed_ci"][1]})
    return out


def variants_table(metrics: dict) -> str:
    """The table of adapt's `metrics` (the dict written to metrics.json) as text: the gap
    closed where `summarize_variants` found one, its interval and each variant's paired
    held-out difference to frozen under it."""
    p, variants = metrics["protocol"], metrics["variants"]
    lines = [f"Online adaptation to {metrics['target']}: {p['stream_prompts']} prompts in batches of "
             f"{p['batch_prompts']}, {p['n']} -> "
             f"{kept_text(p.get('policy', 'topk'), p.get('policy_params', {}), p['k'])} at "
             f"{p['check_tokens']} tokens",
             f"{'variant':<12}{'accuracy':>9}{'tokens':>10}{'ratio':>7}{'explore':>9}{'MC tok':>8}"
             f"{'AUROC last':>11}{'held-out':>9}{'gap closed':>11}{'update s':>9}{'wall s':>8}"]
    for v, s in variants.items():
        gap = f"{s['gap_closed']:.2f}" if "gap_closed" in s else "-"
        lines.append(f"{v:<12}{s['accuracy']:>9.3f}{s['tokens_total']:>10.0f}"
                     f"{s.get('tokens_ratio', math.nan):>7.2f}{s['explore_tokens']:>9.0f}"
                     f"{s.get('mc_tokens', 0.0):>8.0f}"
                     f"{s['auroc_last']:>11.3f}{s['heldout_auroc']:>9.3f}{gap:>11}{s['update_s']:>9.2f}"
                     f"{s['wall_s']:>8.1f}")
    for v, s in variants.items():
        if "heldout_vs_frozen" not in s:
            continue
        d = s["heldout_vs_frozen"]
        gap = ""
        if s.get("no_gap"):
            gap = "; no gap to close: retrained - frozen is not above 0"
        elif "gap_closed_ci" in s:
            lo, hi = s["gap_closed_ci"]
            gap = f"; gap closed {s['gap_closed']:.2f} [{lo:.2f}, {hi:.2f}]"
        lines.append(f"{v}: held-out AUROC - frozen {d['diff']:+.3f} [{d['ci'][0]:+.3f}, "
                     f"{d['ci'][1]:+.3f}] (95%, paired over {d['prompts']} prompts{holm_text(d)}){gap}")
    family = sum(s.get("heldout_vs_frozen", {}).get("p_holm") is not None for s in variants.values())
    if family:
        lines.append(holm_note(family))
    return "\n".join(lines)
