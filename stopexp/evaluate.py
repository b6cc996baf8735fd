"""Stage 3, evaluate: prune with every method under one accounting, and show it.

    python -m stopexp.evaluate +exp=toy_contrastive                    # replay (default)
    python -m stopexp.evaluate +exp=toy_contrastive evaluate.mode=online

Standard protocol (Launch-Check-Resume): N = search.n_paths paths per test prompt, check
at search.check_at, keep K = policy.keep by each method's signal, finish the kept paths,
majority vote; paths that end before the check vote directly. `replay` re-scores the
trace bank without the LM (exact, since every path has its own random stream);
`online` really runs the LM and measures wall time. Methods with a stopping protocol of
their own (ESC, Adaptive-Consistency, DeepConf online and its votes: stopexp/stopping.py)
replay the bank in both modes; stopexp/analyses.py adds the per-method analyses.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from stopexp import bank, plots
from stopexp.analyses import add_analyses
from stopexp.artifacts import write_json
from stopexp.config import (ALWAYS_METHODS, check_method_names, check_output_dirs, checkpoint_tokens,
                            validate)
from stopexp.metrics import (auprc, bootstrap_ci, nonfinite, per_group_auroc, pooled_auroc,
                             text_metrics, within_prompt_auroc)
from stopexp.policies import build_policy
from stopexp.search.sample import vote
from stopexp.signals import methods as M
from stopexp.memory import add_memory
from stopexp.stopping import STOPPING_METHODS, kv_peaks, stopping_outcomes
from stopexp.table import print_table  # pipeline and notebooks import it from here
from stopexp.tracking import tracked_run

log = logging.getLogger(__name__)
ALWAYS = ALWAYS_METHODS


@dataclass
class Paths:
    """The evaluated paths, one row each, grouped by prompt (rows of a prompt contiguous,
    ordered by path id)."""
    group: np.ndarray    # prompt index 0..G-1
    path_id: np.ndarray
    length: np.ndarray   # tokens the path generates when not pruned
    correct: np.ndarray
    answer: np.ndarray   # extracted answers ("" = none)
    text: np.ndarray
    alive: np.ndarray    # still generating at the check
    batch: dict          # predictor batch at the check, for every row
    prompt_ids: np.ndarray | None = None  # the task's prompt id of each group (None: 0..G-1)
    prompt_len: np.ndarray | None = None  # prompt tokens (for the KV-memory estimate; None online)


def method_names(cfg) -> list[str]:
    names = [cfg.predictor.name if m == "learned" else m for m in cfg.evaluate.methods]
    for m in ALWAYS:
        if m not in names:
            names.insert(0, m)
    return list(dict.fromkeys(names))


def check_methods(cfg) -> None:
    """Unknown method names fail before any compute (also checked by config.validate)."""
    check_method_names(cfg.evaluate.methods)


def build_scorers(cfg, names: list[str], spec) -> dict:
    """name -> scorer for every method but no_prune; learned ones load their checkpoint
    (the conf_features control is trained here if missing: it needs no LM)."""
    from stopexp.signals import PREDICTORS
    from stopexp.signals.checkpoint import CheckpointDamaged, CheckpointMismatch, load_predictor
    from stopexp.train import predictor_dir, train

    scorers = {}
    for name in names:
        if name == "no_prune" or name in STOPPING_METHODS:  # no scorer: their own protocol
            continue
        if name == "random":
            scorers[name] = M.random_scorer(cfg.evaluate.seed)
        elif name == "oracle":
            scorers[name] = M.oracle
        elif name in M.BASELINES:
            scorers[name] = M.BASELINES[name]
        elif name in PREDICTORS or name == "super_token":
            sub = cfg if name == cfg.predictor.name else _with_predictor(cfg, name)
            ckpt = predictor_dir(sub)
            command = f"python -m stopexp.train {' '.join(_overrides())}".rstrip()
            if name != cfg.predictor.name:  # a control: made here, a damaged one remade
                train(sub, progress=False)
            elif not (ckpt / "predictor.json").exists():
                raise FileNotFoundError(
                    f"no trained {name} predictor for this config at {ckpt}.\nMake it with:  "
                    f"{command}\n(or run python -m stopexp.pipeline, which makes it for you)")
            try:
                if name == "super_token":  # on its own copy of the LM; online it reads the engine's cache
                    from stopexp.models import load_lm
                    from stopexp.signals.super_token import load_super_token
                    predictor, _ = load_super_token(ckpt, *load_lm(sub, progress=False), spec,
                                                    cfg.search.max_batch_rows)
                else:
                    predictor, _ = load_predictor(ckpt, spec)
            except (CheckpointDamaged, CheckpointMismatch) as e:
                raise type(e)(f"{e}\nRebuild it with:  {command}") from e
            scorers[name] = M.learned(predictor)
        else:
            scorers[name] = M.external(name)
    return scorers


def _with_predictor(cfg, name: str):
    """cfg with conf/predictor/<name>.yaml as its predictor (the controls' config)."""
    from stopexp.config import PredictorConfig

    node = OmegaConf.load(Path(__file__).resolve().parent.parent / "conf" / "predictor" / f"{name}.yaml")
    node.pop("defaults", None)
    sub = cfg.copy()
    sub.predictor = OmegaConf.merge(OmegaConf.structured(PredictorConfig), node)
    return sub


def _overrides() -> list[str]:
    try:
        from hydra.core.hydra_config import HydraConfig
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return []


def prompts_in(root: Path, split: str) -> int:
    """How many prompts of `split` the bank holds (prompt ids run 0..n-1)."""
    return int(bank.load_bank(root, split)["prompt_id"][:].max()) + 1


def replay_paths(root: Path, meta: dict, split: str, checkpoint: int) -> Paths:
    ds = bank.load_bank(root, split)
    if not len(ds):
        raise ValueError(f"evaluate.split: the trace bank has no {split!r} paths")
    c_idx = meta["checkpoints"].index(checkpoint)
    t = bank.tensors_at(ds, c_idx, checkpoint)
    t["seed_key"] = [f"{p}/{j}" for p, j in zip(ds["prompt"][:], ds["path_id"][:])]
    t.update(bank.prefix_columns(ds))  # the super token re-encodes the prefixes
    # groups are dense even where collect left prompts out (model.long_prompts=skip)
    prompt_ids, group = np.unique(np.asarray(ds["prompt_id"][:]).astype(np.int64), return_inverse=True)
    t["group"] = torch.as_tensor(group.astype(np.int64))
    return Paths(group=t["group"].numpy(), path_id=np.asarray(ds["path_id"][:]),
                 length=np.asarray(ds["length"][:]), correct=np.asarray(ds["correct"][:]),
                 answer=np.asarray(ds["answer"][:], dtype=object),
                 text=np.asarray(ds["text"][:], dtype=object), alive=t["alive"].numpy(),
                 batch=t, prompt_ids=prompt_ids, prompt_len=np.asarray(ds["prompt_len"][:]))


def bank_paths_and_confs(root: Path, meta: dict, split: str, checkpoint: int, paths: Paths,
                         views) -> tuple[Paths, list]:
    """The bank's paths (`paths` itself in replay) and their per-token confidences, for the
    methods replayed from the bank in either mode."""
    if views is not None:
        paths = replay_paths(root, meta, split, checkpoint)
    return paths, list(bank.load_bank(root, split)["token_conf"][:])


def outcome(paths: Paths, kept: np.ndarray, checkpoint: int, n: int) -> dict:
    """Vote, accounting and survival for one pruning decision over the first n paths of
    every prompt. `kept` marks the live paths that continue after the check."""
    use = paths.path_id < n
    voter = use & (~paths.alive | kept)
    spent = np.where(voter, paths.length, np.minimum(paths.length, checkpoint)) * use
    G = int(paths.group.max()) + 1
    correct = np.zeros(G, bool)
    chosen = np.full(G, "", dtype=object)
    avg = np.zeros(G)
    for g in range(G):
        rows = np.nonzero((paths.group == g) & voter)[0]
        winner = vote([a or None for a in paths.answer[rows]])
        hit = rows[paths.answer[rows] == winner] if winner is not None else rows[:0]
        correct[g] = bool(len(hit)) and bool(paths.correct[hit[0]])
        chosen[g] = paths.text[hit[0]] if len(hit) else (paths.text[rows[0]] if len(rows) else "")
        avg[g] = paths.correct[rows].mean() if len(rows) else 0.0
    per_prompt_tokens = np.bincount(paths.group, weights=spent, minlength=G)
    seq = np.zeros(G)
    np.maximum.at(seq, paths.group, spent)
    steps = np.arange(1, int(paths.length.max()) + 1)
    survival = ((spent[use][:, None] >= steps[None, :]).mean(0)).tolist()
    stopped = use & paths.alive & ~kept
    pruned_at = np.full(int(stopped.sum()), checkpoint)
    return {"correct": correct, "chosen": chosen, "avg": avg, "tokens": per_prompt_tokens,
            "seq_tokens": seq, "survival": survival, "pruned_at": pruned_at, "stopped": stopped,
            "alive_at_check": float((use & paths.alive).sum() / use.sum()), "spent": spent,
            "kv_peaks": kv_peaks(paths, spent)}


def keep_by_policy(paths: Paths, scores: np.ndarray, cfg, k: int, n: int) -> np.ndarray:
    """Apply the threshold policy prompt by prompt to the live paths among the first n."""
    policy = build_policy(cfg.policy, keep=k)
    kept = np.zeros(len(scores), bool)
    live = paths.alive & (paths.path_id < n)
    for g in range(int(paths.group.max()) + 1):
        rows = np.nonzero((paths.group == g) & live)[0]
        if len(rows):
            kept[rows] = policy.keep(torch.as_tensor(scores[rows])).numpy()
    return kept


def summarize(o: dict, seconds_per_token: float, flops_per_token: float, n_boot: int,
              seed: int) -> dict:
    lo, hi = bootstrap_ci(o["correct"].astype(float), n=n_boot, seed=seed)
    tokens = float(o["tokens"].sum())
    return {"accuracy": float(o["correct"].mean()), "accuracy_ci": [lo, hi],
            "avg_at_k": float(o["avg"].mean()), "tokens_total": tokens,
            "seq_tokens": float(o["seq_tokens"].mean()), "flops": tokens * flops_per_token,
            "wall_s": tokens * seconds_per_token, "wall_estimated": True,
            "mean_prune_step": float(o["pruned_at"].mean()) if len(o["pruned_at"]) else None,
            "alive_at_check": o["alive_at_check"]}


def signal_quality(paths: Paths, scores: np.ndarray, n: int, n_boot: int, seed: int) -> dict:
    """AUROC (within-prompt, primary; pooled) and AUPRC of a method's scores against path
    success, over the live paths at the check. NaN scores rank lowest and +-inf at the
    extremes (`stopexp.metrics.ranking`); `nonfinite_scores` counts them."""
    live = paths.alive & (paths.path_id < n)
    s, y, g = scores[live], paths.correct[live].astype(float), paths.group[live]
    _, per = per_group_auroc(s, y, g)
    per = per[np.isfinite(per)]
    lo, hi = bootstrap_ci(per, n=n_boot, seed=seed) if len(per) else (np.nan, np.nan)
    return {"auroc": within_prompt_auroc(s, y, g), "auroc_ci": [lo, hi],
            "auroc_pooled": pooled_auroc(s, y), "auprc": auprc(s, y),
            "nonfinite_scores": nonfinite(s)}


def evaluate(cfg, run=None, run_dir: Path | None = None) -> dict:
    check_methods(cfg)
    root = bank.require_bank(cfg, _overrides())
    meta = bank.read_meta(root)
    from stopexp.train import feature_spec

    checkpoint = checkpoint_tokens(cfg.search.check_at, cfg.search.max_new_tokens)
    N, K = cfg.search.n_paths, cfg.policy.keep
    names = method_names(cfg)
    scorers = build_scorers(cfg, names, feature_spec(meta))
    start = time.time()
    if cfg.search.name == "beam":
        n_prompts = prompts_in(root, cfg.evaluate.split)
        from stopexp.evaluate_beam import NOT_REPORTED, evaluate_beam, oracle_refusal

        omitted = {}
        if oracle_refusal(cfg.task.name):
            omitted["oracle"] = oracle_refusal(cfg.task.name)
            log.warning("oracle: %s", omitted["oracle"])
            names = [n for n in names if n != "oracle"]
        for n in (n for n in names if n in STOPPING_METHODS):
            omitted[n] = "a stopping protocol over parallel paths; beam search has none"
        names = [n for n in names if n not in STOPPING_METHODS]
        results, texts, prompt_ids = evaluate_beam(cfg, names, scorers, n_prompts)
        not_reported = dict(NOT_REPORTED)
        if cfg.evaluate.text_metrics:
            add_text_metrics(cfg, np.asarray(prompt_ids), texts, results)
        else:
            not_reported["text_metrics"] = "evaluate.text_metrics=false"
        metrics = {"methods": results, "mode": "online", "search": "beam",
                   "protocol": {"beam_width": cfg.search.beam_width, "patience": cfg.search.patience,
                                "policy": cfg.policy.name, "prompts": len(prompt_ids),
                                "split": cfg.evaluate.split},
                   "omitted_methods": omitted, "not_reported": not_reported,
                   "bank": root.name, "eval_wall_s": round(time.time() - start, 2)}
        if run_dir is not None:
            metrics["plots"] = {"survival": str(plots.survival(
                {m: r["survival"] for m, r in results.items()}, run_dir / "survival.png"))}
        if run is not None:
            run.summary_update({f"{m}/{k}": v for m, r in results.items() for k, v in r.items()
                                if isinstance(v, (int, float))})
        return metrics
    views = timing = None
    if cfg.evaluate.mode == "online":  # the same test prompts as the bank
        paths, views, timing = online_paths(cfg, names, scorers, checkpoint,
                                            prompts_in(root, cfg.evaluate.split))
    else:
        paths = replay_paths(root, meta, cfg.evaluate.split, checkpoint)
    sec_tok = meta.get("seconds_per_token", 0.0)
    flops_tok = 2.0 * meta.get("lm_parameters", 0)
    n_boot, seed = cfg.evaluate.bootstrap, cfg.evaluate.seed
    results, outcomes, scores, points = {}, {}, {}, []
    all_rows = np.ones(len(paths.length), bool)
    stops = {}
    if set(names) & set(STOPPING_METHODS):
        stops = stopping_outcomes(*bank_paths_and_confs(root, meta, cfg.evaluate.split, checkpoint,
                                                        paths, views),
                                  names, N, cfg.evaluate, cfg.search.group_window)
    for name in names:
        if name in stops:  # replayed from the bank in either mode (exact)
            outcomes[name] = stops[name]
            results[name] = summarize(stops[name], sec_tok, flops_tok, n_boot, seed) | {
                "replayed": True, "check_s": 0.0}
            points.append({"method": name, "n": N, "k": N, "accuracy": results[name]["accuracy"],
                           "tokens_total": results[name]["tokens_total"]})
            continue
        t0 = time.perf_counter()
        if name != "no_prune":  # scores for AUROC (online too); replay also decides by them
            scores[name] = scorers[name](paths.batch).numpy().astype(float)
        if views is not None:  # online: the vote of what the method's own run produced
            view, kept = views[name]
        else:
            view, kept = paths, keep_by_policy(paths, scores[name], cfg, K, N) if name in scores else None
        check_s = time.perf_counter() - t0
        o = outcome(view, all_rows if name == "no_prune" else kept, checkpoint, N)
        outcomes[name] = o
        r = summarize(o, sec_tok, flops_tok, n_boot, seed)
        r["check_s"] = check_s
        if name in scores:
            r.update(signal_quality(paths, scores[name], N, n_boot, seed))
            if r["nonfinite_scores"]:
                log.warning("%s: %d scores are NaN or infinite; NaN ranks lowest (pruned first), "
                            "+-inf at the extremes", name, r["nonfinite_scores"])
        if cfg.evaluate.mode == "online":
            r.update(timing[name])
        results[name] = r
    base = results["no_prune"]
    for r in results.values():
        r["tokens_ratio"] = r["tokens_total"] / base["tokens_total"]
        r["tokens_per_s"] = r["tokens_total"] / r["wall_s"] if r["wall_s"] else None
        r["pass_at_1"] = base["avg_at_k"]
        r["n"], r["k"] = N, K
    results["no_prune"]["k"] = N
    add_analyses(results, outcomes, scores, paths, N)
    add_memory(results, outcomes, meta.get("kv_bytes_per_token"))
    # the Pareto points: no_prune at several N, every method at several K, and 32 -> 8
    for n in cfg.evaluate.n_points:
        o = outcome(paths, all_rows, checkpoint, n)
        points.append({"method": "no_prune", "n": n, "k": n, "accuracy": float(o["correct"].mean()),
                       "tokens_total": float(o["tokens"].sum())})
    for name, s in scores.items():
        for n, k in {(N, k) for k in cfg.evaluate.retention} | {(min(32, N), min(8, N))}:
            o = outcome(paths, keep_by_policy(paths, s, cfg, k, n), checkpoint, n)
            points.append({"method": name, "n": n, "k": k, "accuracy": float(o["correct"].mean()),
                           "tokens_total": float(o["tokens"].sum())})
    if cfg.evaluate.text_metrics:
        ids = paths.prompt_ids if paths.prompt_ids is not None else np.arange(int(paths.group.max()) + 1)
        add_text_metrics(cfg, ids, {name: list(o["chosen"]) for name, o in outcomes.items()}, results)
    metrics = {"methods": results, "points": points, "mode": cfg.evaluate.mode,
               "protocol": {"n": N, "k": K, "check_tokens": checkpoint, "policy": cfg.policy.name,
                            "prompts": int(paths.group.max()) + 1, "split": cfg.evaluate.split},
               "bank": root.name, "eval_wall_s": round(time.time() - start, 2)}
    if run_dir is not None:
        figs = make_plots(paths, outcomes, scores, points, run_dir)
        metrics["plots"] = {k: str(v) for k, v in figs.items()}
        if run is not None:
            run.log({f"plots/{k}": run.image(v) for k, v in figs.items()})
    if run is not None:
        run.use_artifact(f"traces-{root.name}", type="trace_bank")
        run.summary_update({f"{m}/{k}": v for m, r in results.items() for k, v in r.items()
                            if isinstance(v, (int, float))})
        run.log({"samples": sample_table(run, paths, scores, cfg, K, N)})
    return metrics


def add_text_metrics(cfg, prompt_ids: np.ndarray, chosen: dict, results: dict) -> None:
    """BLEU / ROUGE / BERTScore of each method's chosen output (`chosen[name][g]` for the
    g-th prompt, whose task prompt id is `prompt_ids[g]`) against the reference solution
    and against the no_prune output."""
    from stopexp.metrics import BertScorer
    from stopexp.tasks import build_task

    task = build_task(cfg.task)
    problems = task.problems(cfg.evaluate.split, int(prompt_ids.max()) + 1)
    refs = [task.reference(problems[i]) for i in prompt_ids]
    scorer = BertScorer(cfg.evaluate.bertscore_model) if cfg.evaluate.bertscore_model else BertScorer()
    base = list(chosen["no_prune"])
    level = getattr(task, "text_level", "word")  # characters for the arithmetic task only
    for name, hyps in chosen.items():
        hyps = list(hyps)
        for key, against in (("text_vs_reference", refs), ("text_vs_no_prune", base)):
            m = results[name][key] = text_metrics(hyps, against, level=level, scorer=scorer)
            if m.get("truncated"):
                log.warning("%s %s: BERTScore cut %d of %d outputs at the encoder's maximum "
                            "length (their ends do not count)", name, key, m["truncated"], len(hyps))


def online_paths(cfg, names, scorers, checkpoint, n_prompts: int):
    """Run Launch-Check-Resume with the LM. Returns the paths as the no_prune run saw
    them, per method the paths as that method's run saw them with its kept set, and per
    method the measured time."""
    from stopexp.memory import kv_bytes_per_token, memory_summary
    from stopexp.models import load_lm
    from stopexp.search.decode import SamplingParams, make_engine
    from stopexp.search.parallel import launch_check_resume
    from stopexp.search.sample import fit_prompts, prompt_limit, row_cap
    from stopexp.taps import Taps
    from stopexp.tasks import build_task

    task = build_task(cfg.task)
    model, tokenizer = load_lm(cfg)
    problems = fit_prompts(tokenizer, task.problems(cfg.evaluate.split, n_prompts),
                           prompt_limit(cfg, model), cfg.model.long_prompts)
    N, K = cfg.search.n_paths, cfg.policy.keep
    methods = {m: (scorers[m], lambda: build_policy(cfg.policy, keep=K))
               for m in names if m in scorers}
    with Taps.from_config(model, cfg.tap) as taps:
        engine = make_engine(model, tokenizer, SamplingParams.from_config(cfg), taps,
                             (checkpoint,))
        runs, batch = launch_check_resume(engine, tokenizer, task, problems, N, cfg.seed,
                                          checkpoint, methods, cfg.search.group_window,
                                          row_cap(cfg, tokenizer, problems))
    keys = [(i, j) for i in range(len(problems)) for j in range(N)]
    views, timing = {}, {}
    for name, run in runs.items():
        text = np.asarray([run.text[k] for k in keys], dtype=object)
        answer = np.asarray([task.answer_of(t) for t in text], dtype=object)
        views[name] = (Paths(
            group=np.repeat(np.arange(len(problems)), N), path_id=np.tile(np.arange(N), len(problems)),
            length=np.asarray([run.length[k] for k in keys]),
            correct=np.asarray([task.check(problems[i], t) for (i, _), t in zip(keys, text)]),
            answer=answer, text=text, alive=np.asarray([k in batch["row"] for k in keys]),
            batch={}, prompt_ids=np.asarray([p.prompt_id for p in problems])),
            np.asarray([run.kept[k] for k in keys]))
        gen = run.prefix_s + run.resume_s
        timing[name] = {"wall_s": run.wall_s, "wall_estimated": False, "check_s": run.check_s, "prefix_s": run.prefix_s,
                        "resume_s": run.resume_s,
                        "check_share": run.check_s / gen if gen else 0.0,
                        **memory_summary([run.kv.peak[i] for i in range(len(problems))],
                                         kv_bytes_per_token(model), estimated=False)}
    paths = views["no_prune"][0]
    rows = [batch["row"][k] for k in keys if k in batch["row"]]
    paths.batch = _scatter(batch, rows, len(keys), paths)
    return paths, views, timing


def _scatter(batch: dict, rows: list[int], n: int, paths: Paths) -> dict:
    """The check batch (live paths only; `rows[i]` is the batch row of the i-th live path)
    spread over all n paths, zeros where a path ended before the check."""
    live = torch.as_tensor(np.nonzero(paths.alive)[0])
    full = {}
    for key in ("hidden", "signals", "prefix_len", "mc"):
        v = batch[key][rows]
        full[key] = torch.zeros((n, *v.shape[1:]), dtype=v.dtype)
        full[key][live] = v
    full["mc"][torch.as_tensor(~paths.alive)] = float("nan")
    full["correct"] = torch.as_tensor(paths.correct.astype(np.float32))
    full["seed_key"], full["prompt"], full["tokens"] = [""] * n, [""] * n, [[]] * n
    for r, i in zip(rows, live.tolist()):
        full["seed_key"][i] = batch["seed_key"][r]
        full["prompt"][i], full["tokens"][i] = batch["prompt"][r], batch["tokens"][r]
    return full


def make_plots(paths: Paths, outcomes: dict, scores: dict, points: list, run_dir: Path) -> dict:
    figs = {"pareto": plots.pareto(points, run_dir / "pareto.png"),
            "survival": plots.survival({m: o["survival"] for m, o in outcomes.items()},
                                       run_dir / "survival.png"),
            "prune_steps": plots.prune_steps({m: o["pruned_at"] for m, o in outcomes.items()},
                                             run_dir / "prune_steps.png")}
    figs["signal_histograms"] = plots.signal_histograms(
        {m: s[paths.alive] for m, s in scores.items()}, paths.correct[paths.alive],
        run_dir / "signal_histograms.png")
    learned = [m for m in scores if m not in M.NON_LEARNABLE and m not in ("random", "oracle")]
    for m in learned:
        s = scores[m][paths.alive]
        figs[f"calibration_{m}"] = plots.reliability_diagram(
            1 / (1 + np.exp(-s)), paths.correct[paths.alive], run_dir / f"calibration_{m}.png", m)
    return figs


def sample_table(run, paths: Paths, scores: dict, cfg, k: int, n: int, rows: int = 32):
    method = next((m for m in scores if m not in M.NON_LEARNABLE and m not in ("random", "oracle")),
                  "confidence")
    s = scores[method]
    kept = keep_by_policy(paths, s, cfg, k, n)
    idx = np.nonzero(paths.alive)[0][:rows]
    return run.table(["text", f"score ({method})", "kept", "correct"],
                     [[paths.text[i], float(s[i]), bool(kept[i]), bool(paths.correct[i])] for i in idx])


@hydra.main(config_path="../conf", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    validate(cfg)
    check_output_dirs(cfg)
    from hydra.core.hydra_config import HydraConfig

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    with tracked_run(cfg, "evaluate") as run:  # tracking fails safe: the outputs never depend on it
        metrics = evaluate(cfg, run, run_dir)
        write_json(run_dir / "metrics.json", metrics)
    print(print_table(metrics))
    log.info("plots and metrics.json in %s", run_dir)
    return metrics


if __name__ == "__main__":
    main()
