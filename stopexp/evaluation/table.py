"""Evaluate's console table: one row per method (accuracy with its bootstrap CI, avg@K,
tokens and their ratio to no_prune, within-prompt and pooled AUROC, wall seconds, peak
KV-cache MiB of one prompt's run: `peak_kv_bytes`, stopexp.search.memory), then
the Pareto points of no_prune and the first learned method; beam-search runs get their own
columns. Also the table of a replay on an answers-only bank (`answers_table`)."""
from __future__ import annotations

from stopexp.core.policies import kept_text
from stopexp.evaluation.first_errors import timing_lines
from stopexp.evaluation.paired import in_order, is_probe, role_label
from stopexp.metrics.multiplicity import holm_note, holm_text


def protocol_line(metrics: dict) -> str:
    """"Launch-Check-Resume N -> K at T tokens, P split prompts (mode)": the protocol of
    evaluate's `metrics`, every check of a progressive run, each with what it keeps."""
    p = metrics["protocol"]
    checks = p.get("checks") or [[p["check_tokens"], p["k"]]]  # progressive: every check
    policy, params = p.get("policy", "topk"), p.get("policy_params", {})
    at = " -> ".join(f"{kept_text(policy, params, k, i)} at {tokens} tokens"
                     for i, (tokens, k) in enumerate(checks))
    return f"Launch-Check-Resume {p['n']} -> {at}, {p['prompts']} {p['split']} prompts ({metrics['mode']})"


def print_table(metrics: dict) -> str:
    """The table of evaluate's `metrics` (the dict written to metrics.json) as text."""
    p = metrics["protocol"]
    w = max(14, 2 + max(map(len, metrics["methods"])))  # the method column
    if metrics.get("search") == "beam":
        kept = kept_text(p["policy"], p.get("policy_params", {}), p.get("k"))
        lines = [f"Beam search B={p['beam_width']}, patience {p['patience']}, each step keeps {kept}, "
                 f"{p['prompts']} {p['split']} prompts",
                 f"{'method':<{w}}{'accuracy':>9}{'95% CI':>16}{'tokens':>10}{'ratio':>7}"
                 f"{'pruned':>8}{'wall s':>8}{'check %':>9}   accuracy - no_prune, paired 95% CI"]
        for name, r in metrics["methods"].items():
            ci = f"[{r['accuracy_ci'][0]:.3f},{r['accuracy_ci'][1]:.3f}]"
            d = r.get("accuracy_vs_no_prune")
            vs = f"   {_signed(d)}" if d else ""
            lines.append(f"{name:<{w}}{r['accuracy']:>9.3f}{ci:>16}{r['tokens_total']:>10.0f}"
                         f"{r['tokens_ratio']:>7.2f}{r['pruned']:>8}{r['wall_s']:>8.1f}"
                         f"{100 * r['check_share']:>9.2f}{vs}")
        family = sum("p_holm" in r.get("accuracy_vs_no_prune", {}) for r in metrics["methods"].values())
        if family:
            lines.append(holm_note(family))
        return "\n".join(lines)
    policy = p.get("policy", "topk")
    lines = [protocol_line(metrics),
             f"{'method':<{w}}{'accuracy':>9}{'95% CI':>16}{'avg@K':>8}{'tokens':>10}{'ratio':>7}"
             f"{'AUROC':>7}{'pooled':>8}{'wall s':>8}{'KV MiB':>8}"]
    for name, r in metrics["methods"].items():
        ci = f"[{r['accuracy_ci'][0]:.3f},{r['accuracy_ci'][1]:.3f}]"
        au = f"{r['auroc']:.3f}" if "auroc" in r else "-"
        pooled = f"{r['auroc_pooled']:.3f}" if "auroc_pooled" in r else "-"
        kv = f"{r['peak_kv_bytes'] / 2**20:.2f}" if "peak_kv_bytes" in r else "-"
        lines.append(f"{name:<{w}}{r['accuracy']:>9.3f}{ci:>16}{r['avg_at_k']:>8.3f}"
                     f"{r['tokens_total']:>10.0f}{r['tokens_ratio']:>7.2f}{au:>7}{pooled:>8}"
                     f"{r['wall_s']:>8.1f}{kv:>8}")
    lines += risk_lines(metrics)
    rewarded = {m: r for m, r in metrics["methods"].items() if "mean_reward" in r}
    if rewarded and metrics.get("select", "vote") != "vote" or any("spearman_within" in r for r in rewarded.values()):
        lines.append(f"selection by {metrics.get('select', 'vote')}: reward of the chosen output "
                     "(mean), ROUGE-L vs reference / vs no_prune / vs beam, within-prompt rank of the reward")
        for name, r in rewarded.items():
            rl = [f"{r[k]['rougeL']:.3f}" if k in r else "-"
                  for k in ("text_vs_reference", "text_vs_no_prune", "text_vs_beam")]
            rank = (f"spearman {r['spearman_within']:+.3f} kendall {r['kendall_within']:+.3f} "
                    f"AUROC>median {r['auroc_above_median']:.3f}" if "spearman_within" in r else "")
            lines.append(f"  {name:<{w}}reward {r['mean_reward']:.4f}  ROUGE-L {' / '.join(rl)}  {rank}")
        if "beam_search" in metrics:
            b = metrics["beam_search"]
            lines.append(f"  {'beam search':<{w}}reward {b.get('mean_reward', float('nan')):.4f}  ROUGE-L "
                         f"{b['text_vs_reference']['rougeL']:.3f} vs reference, {b['tokens_total']:.0f} tokens")
    learned = [m for m in metrics["methods"] if is_probe(m)]
    pts = [q for q in metrics.get("points", []) if q["method"] in ("no_prune", *learned[:1])]
    if pts:
        lines.append("points (N -> K: accuracy / tokens): " + "   ".join(
            f"{q['method']} {q['n']}->{q['k']}: {q['accuracy']:.3f} / {q['tokens_total']:.0f}"
            for q in sorted(pts, key=lambda q: (q["method"] != "no_prune", q["n"], q["k"]))))
        if policy != "topk":
            lines.append(f"  policy={policy} has no K to sweep: a method's point is its run, K the "
                         "paths its rule kept per prompt (mean); evaluate.retention applies to "
                         "policy=topk")
    timing = timing_lines(metrics["first_wrong_value"]) if "first_wrong_value" in metrics else []
    return "\n".join(lines + paired_lines(metrics) + timing)


def risk_lines(metrics: dict) -> list[str]:
    """policy=risk: each method's realised risk on the evaluated split against alpha, with
    its 95% interval, and the validation risk its threshold was certified at."""
    p = metrics["protocol"]
    if p.get("policy") != "risk":
        return []
    q = p["policy_params"]
    lines = [f"{q['risk']} risk on the {p['split']} prompts (alpha {q['alpha']}, delta {q['delta']}): "
             "realised [95% interval], validation risk at the certified quantile level"]
    for name, r in metrics["methods"].items():
        if "risk" in r:
            k, c = r["risk"], r["risk"]["calibration"]
            level = "none certified" if c["level"] is None else f"level {c['level']}"
            lines.append(f"  {name:<22}{k['realised']:.4f} [{k['interval'][0]:.4f},{k['interval'][1]:.4f}]"
                         f"  val {c['risk_hat']:.4f} ({level}, {c['prompts']} prompts)")
    return lines


def _signed(d: dict) -> str:
    return f"{d['diff']:+.3f} [{d['ci'][0]:+.3f},{d['ci'][1]:+.3f}]{holm_text(d)}"


def _runs(positions: list, where: list) -> str:
    """The positions where `where` holds, consecutive stored positions joined: "3-8,12"."""
    spans, start = [], None
    for i, hit in enumerate([*where, False]):
        if hit and start is None:
            start = i
        elif not hit and start is not None:
            a, b = positions[start], positions[i - 1]
            spans.append(f"{a}" if a == b else f"{a}-{b}")
            start = None
    return ",".join(spans) or "none"


def paired_lines(metrics: dict) -> list[str]:
    """The paired differences (probe - control) of metrics.json's "paired" and
    "paired_by_prefix" (stopexp/evaluation/paired.py): per probe and control the AUROC
    difference at each check and the vote-accuracy difference with their 95% bootstrap
    intervals, and the prefixes where the interval lies above or below 0."""
    paired = metrics.get("paired") or {}
    if not paired:
        return []
    checks = paired["checks"]
    lines = [f"paired differences, probe - control: mean over prompts, 95% bootstrap CI over "
             f"prompts ({paired['bootstrap']} resamples, seed {paired['seed']}); an interval "
             "with 0 inside: not distinguishable"]
    if "holm_family" in paired:
        lines.append(f"  {holm_note(paired['holm_family'], paired['bootstrap'])}")
    for c in checks:
        lines.append(f"  AUROC at {c['tokens']} tokens: {c['mixed_prompts']} prompts with mixed "
                     f"outcomes ({c['excluded_prompts']} excluded: all paths right or all wrong)")
    lines.append(f"  accuracy: the run's vote at the same kept K, {paired['prompts']} prompts")
    for probe, roles in checks[0]["auroc_diff"].items():
        for role in in_order(roles):
            cells = []
            for c in checks:
                named = f" {c['best_non_learned']}" if role == "best_non_learned" else ""
                cells.append(f"AUROC@{c['tokens']}{named} {_signed(c['auroc_diff'][probe][role])}")
            acc = paired["accuracy_diff"].get(probe, {}).get(role)
            if acc is not None:
                named = f" {paired['accuracy_best_non_learned']}" if role == "best_non_learned" else ""
                cells.append(f"accuracy{named} {_signed(acc)}")
            lines.append(f"  {probe + ' - ' + role_label(role):<30}" + "  ".join(cells))
    prefix = metrics.get("paired_by_prefix") or {}
    for probe, roles in prefix.get("auroc_diff", {}).items():
        for role in in_order(roles):
            lo, hi = [c[0] for c in roles[role]["ci"]], [c[1] for c in roles[role]["ci"]]
            holm = (f"; surviving Holm over the prefixes: {_runs(prefix['positions'], roles[role]['holm'])}"
                    if "holm" in roles[role] else "")
            lines.append(f"  by prefix, {probe} - {role_label(role)}: interval above 0 at "
                         f"{_runs(prefix['positions'], [x > 0 for x in lo])}; below 0 at "
                         f"{_runs(prefix['positions'], [x < 0 for x in hi])} "
                         f"(tokens, of {len(prefix['positions'])} stored prefixes){holm}")
    return lines


def answers_table(metrics: dict) -> str:
    """The console table of a replay on an answers-only bank (python -m
    stopexp.answers_replay): per method the mean (std) over the shuffles, then where the
    published grader (stored strings) differs."""
    p = metrics["protocol"]
    lines = [f"Answers-only replay of {p['source']}: {p['prompts']} prompts, n={p['n']} of the stored "
             f"branches, mean (std) over {p['shuffles']} shuffles; random keeps k={p['k']} at "
             f"{p['check_tokens']} tokens",
             f"{'method':<22}{'accuracy':>9}{'(std)':>8}{'tokens/prompt':>15}{'(std)':>10}"
             f"{'ratio':>7}{'launched':>9}{'wrongly pruned':>15}"]
    for name, r in metrics["methods"].items():
        ws = f"{r['wrongly_pruned']:.3f}" if r["wrongly_pruned"] is not None else "-"
        ratio = f"{r['tokens_ratio']:.2f}" if "tokens_ratio" in r else "-"
        lines.append(f"{name:<22}{r['accuracy']:>9.3f}{r['accuracy_std']:>8.3f}"
                     f"{r['tokens_per_prompt']:>15.0f}{r['tokens_per_prompt_std']:>10.0f}{ratio:>7}"
                     f"{r['branches_launched']:>9.1f}{ws:>15}")
    g, methods = metrics["graders"], metrics["methods"]
    if g["moved"] or any(t != methods[m]["tokens_per_prompt"] for m, t in g["tokens_per_prompt_exact"].items()):
        lines.append("by stored string and string equality with the gold answer (the published "
                     "grader): accuracy / tokens per prompt " + ", ".join(
                         f"{m} {a:.3f} / {g['tokens_per_prompt_exact'][m]:.0f}"
                         for m, a in g["accuracy_exact"].items()))
        for row in g["moved"]:
            moves = {m: ab for m, ab in row.items() if m not in ("prompt", "gold") and ab[0] != ab[1]}
            lines.append(f"  prompt {row['prompt']} (gold {row['gold']}): "
                         + ", ".join(f"{m} {a:.2f} -> {b:.2f}" for m, (a, b) in moves.items()))
    return "\n".join(lines)
