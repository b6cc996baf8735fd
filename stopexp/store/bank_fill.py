"""Filling a trace bank: the shard plan over the configured splits, the shards already
written that still fit (kept), the missing or misfitting ones sampled by the LM (rank by
rank), and the bank's meta.json with its summary. Shards are written atomically, so an
interrupted collect resumes after the last finished one. Collects of one bank (the jobs of
an array, or identical jobs of a sweep) generate in parallel; they check and set shards
aside, and write meta.json, in turns under the bank's lock (`artifact_lock`), and a shard
two of them wrote is kept as the first one published it (`bank.write_shard`)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf
from tqdm import tqdm

from stopexp.models.extract import StepEnds
from stopexp.runtime.artifacts import artifact_lock
from stopexp.runtime.integrity import set_aside
from stopexp.runtime.ranks import barrier, in_group
from stopexp.search.decode import SamplingParams
from stopexp.search.memory import kv_bytes_per_token
from stopexp.search.sample import PromptTooLong, fit_prompts, prompt_limit, row_cap
from stopexp.search.trace import has_values, trace_problems
from stopexp.store import bank
from stopexp.store.keys import BankSpec
from stopexp.store.tapped_features import finish_tapped, write_tapped
from stopexp.tasks import build_task, vote_format
from stopexp.tasks.answers import vote, vote_clusters
from stopexp.tasks.rewards import build_reward

log = logging.getLogger(__name__)


def plan(collect, task) -> list[list]:
    """The shards of the collection (the `collect` section: prompts per split, prompts per
    shard): lists of the `task`'s problems, split by split, in a fixed order."""
    shards = []
    for split, n in collect.prompts.items():
        problems = task.problems(split, n) if n else []
        size = collect.shard_prompts
        shards += [problems[i : i + size] for i in range(0, len(problems), size)]
    return shards


def difficulty_filter(collect, cols: dict) -> dict:
    """Keep the prompts whose number of correct paths lies in collect.keep_correct."""
    band = collect.keep_correct
    if band is None or not cols["split"] or cols["split"][0] not in collect.keep_correct_splits:
        return cols
    prompts = np.asarray(cols["prompt_id"])
    correct = np.asarray(cols["correct"])
    keep_ids = [p for p in np.unique(prompts) if band[0] <= correct[prompts == p].sum() <= band[1]]
    mask = np.isin(prompts, keep_ids)
    return {k: [v for v, m in zip(vals, mask) if m] for k, vals in cols.items()}


def summarize(root: Path, answer_format: str | None = None) -> dict:
    """Per-path and vote accuracy, tokens and sanity counts over the whole bank; equivalent
    answers of `answer_format` (the task's `vote_format`) vote as one."""
    ds = bank.load_bank(root)
    correct = np.asarray(ds["correct"][:])
    keys = np.asarray([f"{s}/{p}" for s, p in zip(ds["split"][:], ds["prompt_id"][:])])
    answers = np.asarray(ds["answer"][:])
    votes = []
    for key in np.unique(keys):
        sel = keys == key
        clustered = np.asarray(vote_clusters(answers[sel], answer_format), dtype=object)
        winner = vote([a or None for a in clustered])
        votes.append(winner is not None and correct[sel][clustered == winner].any())
    tokens = int(np.asarray(ds["length"][:]).sum())
    thinking = int(np.asarray(ds["thinking_tokens"][:]).sum()) if "thinking_tokens" in ds.column_names else None
    return {"paths": int(len(correct)), "prompts": int(len(votes)),
            "path_accuracy": float(correct.mean()), "vote_accuracy": float(np.mean(votes)),
            "mean_reward": float(bank.rewards_of(ds).mean()), "tokens_total": tokens,
            **({"thinking_tokens": thinking, "answer_tokens": tokens - thinking} if thinking is not None else {})}


def plan_parts(shards: list) -> dict[int, dict]:
    """index -> the split and number of prompts of each shard of the plan (as recorded)."""
    return {i: {"split": s[0].split, "prompts": len(s)} for i, s in enumerate(shards)}


def verified_shards(root: Path, indices, plan: dict[int, dict], want: dict,
                    trusted: set[str] = frozenset()) -> dict[int, str]:
    """index -> name of a shard that matches its record byte for byte, for each of
    `indices` that has one. Damaged shards (unreadable record, a file missing, truncated or
    garbled) and shards whose record says they belong elsewhere (another bank, another part
    of the `plan`, an LM of another size than `want`, the bank's expected record:
    `bank.shard_misfit`) are set aside, so that they are recomputed; `trusted` shards were
    just written by this process and are not read again."""
    found, good = bank.shard_dirs(root), {}
    for i in indices:
        for name in found.get(i, []):
            problem = None if name in trusted else bank.shard_problem(root / name, full=True)
            if problem is None and name not in trusted:
                problem = bank.shard_misfit(root, name, bank.read_record(root / name), plan, want)
            if problem is None:
                good.setdefault(i, name)  # a duplicate from another world size is ignored
            else:
                log.warning("trace bank %s: shard %s is damaged or misfits (%s); set aside, it is "
                            "recomputed by the collect that owns it", root, name, problem)
                set_aside(root / name)
    return good


@dataclass(frozen=True)
class Collection:
    """What collect fills a bank with: the bank, and the sections its paths are made by;
    a stage builds it once (stopexp.stages.build.collection)."""
    bank: BankSpec
    model: Any      # the LM
    task: Any       # its questions
    search: Any     # the sampling
    collect: Any    # prompts per split and shard, Monte Carlo rollouts, the difficulty band
    reward: Any
    engine: Any     # hf or vllm
    seed: int
    cache_dir: str  # where the LM's converted or trained weights are cached
    # (generator, model, tokenizer) of the engine for sampling params and an optional tap
    # (stopexp.engines.Backend.open, bound to the model, engine, cache and task sections)
    open_engine: Any
    # the features tapped inside the engine while it generates (stopexp.search.vllm_taps),
    # written beside the bank; None: featurize extracts them from the stored tokens
    features: Any = None


def collect(job: Collection, rank: int = 0, world: int = 1, run=None) -> dict:
    """Fill the bank of `job` (this rank's shards), repairing damaged shards and a
    damaged meta.json; returns the summary of the bank.

    The bank is marked complete only when every shard of the plan is there and matches
    its record byte for byte. A single process (world 1) or a launcher group that cannot
    complete it raises BankDamaged; one job of an array (collect.rank/world) may end with
    it incomplete (the other jobs finish it), which it logs with the ranks still owing."""
    root = job.bank.root
    task = build_task(job.task, job.model.get("thinking"))
    shards = plan(job.collect, task)
    todo = [i for i in range(len(shards)) if i % world == rank]
    with artifact_lock(root):  # no other collect sets a shard aside while this one reads it
        done = verified_shards(root, todo, plan_parts(shards), job.bank.want)
    pending = [i for i in todo if i not in done]
    checkpoints = job.bank.checkpoints
    written, paths = _fill(job, root, task, shards, pending, rank, checkpoints) if pending else (set(), 0)
    # what this process did, for its log line (a rank that is not last sees no summary)
    mine = {"rank": rank, "world": world, "shards_written": len(pending), "paths_written": paths,
            "shards_total": len(shards)}
    grouped = in_group()
    if grouped:
        barrier()  # every rank's shards exist before rank 0 verifies them and writes meta
    if grouped and rank:
        barrier()  # rank 0 has written meta.json: report what it found
        complete, lost = bank.read_meta(root).get("complete", False), "see rank 0's log"
    else:
        missing = _settle(job, root, task, shards, set(done.values()) | written, rank)
        if grouped:
            barrier()
        complete = not missing
        lost = f"{len(missing)} of {len(shards)} shards missing (indices {bank.brief(missing)})"
    if not complete:
        if world == 1 or grouped:  # every rank has run: nobody is left to complete it
            raise bank.BankDamaged(f"trace bank {root} is still incomplete after collect: {lost}; "
                                   "did another process remove shards meanwhile? Rerun collect.")
        owners = sorted({i % world for i in missing})
        log.info("rank %d of %d: its shards are written; the bank %s is not complete yet (%s, "
                 "of ranks %s): those ranks' jobs complete it (one that already ended: rerun "
                 "it, or one collect without collect.rank/world)", rank, world, root, lost,
                 bank.brief(owners))
        return {"bank": str(root), "complete": False, **mine,
                "shards_done": len(shards) - len(missing)}
    if grouped and rank:
        return {"bank": str(root), "complete": True, **mine}
    summary = summarize(root, vote_format(job.task))
    if job.features is not None:
        finish_tapped(job.features)
    if run is not None:
        meta = bank.read_meta(root)
        run.summary_update({f"collect/{k}": v for k, v in summary.items()})
        run.log_artifact(root, name=f"traces-{root.name}", type="trace_bank",
                         metadata={**{k: v for k, v in meta.items() if k not in ("shards", "plan")},
                                   **summary})
        run.log({"collect/sample_paths": _sample_table(run, root)})
    return {"bank": str(root), "complete": True, **mine, **summary}


def _settle(job, root: Path, task, shards: list, trusted: set[str], rank: int) -> list[int]:
    """Verify every shard of the plan (byte for byte, except the `trusted` ones this
    process has just checked or written) and write meta.json if this process may: rank 0,
    or any process that finds the bank complete. Returns the indices still missing. Under
    the bank's lock, so that the shards meta.json records are the ones in place."""
    with artifact_lock(root):
        return _settle_locked(job, root, task, shards, trusted, rank)


def _settle_locked(job, root: Path, task, shards: list, trusted: set[str], rank: int) -> list[int]:
    parts, want = plan_parts(shards), job.bank.want
    good = verified_shards(root, range(len(shards)), parts, want, trusted)
    missing = [i for i in range(len(shards)) if i not in good]
    if rank == 0 or not missing:
        missing = _write_meta(job, root, task, shards, good, missing)
        if missing:  # another job of an array may have finished meanwhile: never leave
            good = verified_shards(root, range(len(shards)), parts, want, set(good.values()))
            if len(good) == len(shards):  # a stale "incomplete" behind
                missing = _write_meta(job, root, task, shards, good, [])
    return missing


def _fill(job, root: Path, task, shards: list, pending: list[int], rank: int,
          checkpoints: list[int]) -> set[str]:
    """Generate the `pending` shards (Monte Carlo labels at `checkpoints`); returns the
    names written and the paths they hold."""
    reward = build_reward(job.reward) if job.reward.name != "correct" else None  # None: outcome
    params = SamplingParams.from_config(job.search, job.task, job.model.get("thinking"))
    n_prompts = sum(len(shards[i]) for i in pending)
    log.info("collecting %d shards (%d prompts x %d paths) into %s", len(pending), n_prompts,
             job.search.n_paths, root)
    paths, tokens, written = 0, 0, set()
    tapped = {} if job.features is None else {"tap": job.features.tap,
                                              "positions": job.features.positions}
    with job.open_engine(params, **tapped) as (engine, model, tokenizer), \
            tqdm(total=n_prompts, unit="prompt", desc="collect") as bar:
        start = time.time()  # the rates shown leave out loading the LM (or starting vLLM)
        text_cfg = model.config.get_text_config()
        feats = bank.features(len(checkpoints), hasattr(task, "end_tag"), has_values(task))
        measured = {"lm_parameters": sum(p.numel() for p in model.parameters()),
                    "hidden_size": text_cfg.hidden_size, "num_layers": text_cfg.num_hidden_layers,
                    "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
                    "kv_bytes_per_token": kv_bytes_per_token(model), "engine": engine.record()}
        step_end = StepEnds(tokenizer, job.features.positions["separator"]) if job.features else None
        limit = prompt_limit(job.model, job.search, job.engine, model)
        # every prompt is measured before any is generated: a plan that model.long_prompts=skip
        # empties entirely is refused now, not after a whole collect of nothing
        fitted = {i: fit_prompts(tokenizer, shards[i], limit, job.model.long_prompts) for i in pending}
        if not any(fitted.values()):
            raise PromptTooLong(
                f"model.max_prompt_tokens: all {n_prompts} prompts are longer than the {limit} "
                "tokens allowed (model.max_prompt_tokens, else the model's positions minus "
                "search.max_new_tokens), and model.long_prompts=skip leaves every one out: "
                "nothing to collect. Allow longer prompts or shorten them")
        for i in pending:
            shard_start = time.time()
            problems = fitted[i]
            clipped_before = reward.clipped if reward is not None else 0
            cols, mc_tokens = trace_problems(engine, tokenizer, task, problems, job.search.n_paths,
                                             job.seed, checkpoints, job.collect.mc_rollouts,
                                             row_cap(job.search, job.model, tokenizer, problems), reward)
            shard_tokens = int(sum(cols["length"])) + mc_tokens
            paths += len(cols["length"])
            tokens += shard_tokens
            name = bank.shard_name(i, rank)
            # metric values clipped into [0, 1] (rounding only: stopexp.metrics.bounds)
            clipped = {} if reward is None else {"rewards_clipped": reward.clipped - clipped_before}
            if clipped.get("rewards_clipped"):
                log.info("shard %s: %d rewards clipped into [0, 1] (rounding)", name,
                         clipped["rewards_clipped"])
            kept = difficulty_filter(job.collect, cols)
            states = kept.pop("states", None)
            # the prompts left out, by cause: an empty split's error names the right one
            dropped = {"too_long": len(shards[i]) - len(problems),
                       "filtered": len(set(cols["prompt_id"])) - len(set(kept["prompt_id"]))}
            record = bank.write_shard(root, name, kept, feats,
                                      {"bank": root.name, "split": shards[i][0].split,
                                       "prompts": len(shards[i]), "tokens": shard_tokens,
                                       "seconds": time.time() - shard_start,
                                       **measured, **clipped, **dropped})
            if states is not None:
                write_tapped(job.features, name, kept, states, record, step_end,
                             list(engine.taps.layers), text_cfg.hidden_size, time.time() - shard_start)
            written.add(name)
            bar.update(len(shards[i]))
            rate = time.time() - start
            bar.set_postfix(paths_s=f"{paths / rate:.0f}", tok_s=f"{tokens / rate:.0f}")
    return written, paths


def _write_meta(job, root: Path, task, shards: list, good: dict[int, str],
                missing: list[int]) -> list[int]:
    """Write the bank's metadata and its record: the plan, and per shard present its own
    record (rows, files, sizes, checksums). Sizes and timings come from the shards' records
    (the processes that computed them), else from the config (nothing computed yet). Nothing
    is read from an earlier meta.json, so a damaged one is simply replaced. Returns the
    indices still missing (a shard removed meanwhile counts)."""
    records = {good[i]: bank.read_record(root / good[i]) for i in sorted(good)}
    missing = sorted({*missing, *(i for i in good if records[good[i]] is None)})
    records = {name: rec for name, rec in records.items() if rec is not None}
    size = job.model.toy if job.model.toy is not None else job.model
    known = {"hidden_size": size.hidden_size, "num_layers": getattr(size, "num_layers", None)}
    with_data = [r for r in records.values() if "hidden_size" in r]
    if with_data:
        tokens = sum(r["tokens"] for r in with_data)
        known = {k: with_data[0][k] for k in ("lm_parameters", "hidden_size", "num_layers", "dtype",
                                              "kv_bytes_per_token")}
        known.update({"engine": r["engine"] for r in with_data[:1] if "engine" in r})
        known["seconds_per_token"] = sum(r["seconds"] for r in with_data) / max(tokens, 1)
    bank.write_meta(root, {
        "key": root.name, "complete": not missing, "model_name": job.model.name,
        "checkpoints": job.bank.checkpoints,  # where the Monte Carlo labels are
        "n_paths": job.search.n_paths, "task": OmegaConf.to_container(job.task),
        "seed": job.seed, "mc_rollouts": job.collect.mc_rollouts,
        "version": bank.BANK_VERSION, **known,
        "plan": [{"index": i, **part} for i, part in plan_parts(shards).items()],
        "shards": records, **({"missing": missing} if missing else {}),
        # which source rows form each split (file-based tasks), fixed by task.seed
        **({"split_rows": task.split_rows} if hasattr(task, "split_rows") else {})})
    return missing


def _sample_table(run, root: Path, n: int = 20):
    ds = bank.load_bank(root)
    rows = [[ds["prompt"][i], ds["text"][i], bool(ds["correct"][i]), int(ds["length"][i]),
             ds["style"][i]] for i in range(min(n, len(ds)))]
    return run.table(["prompt", "text", "correct", "length", "style"], rows)
