"""A trace bank's shard plan and bookkeeping: the shards of the configured splits, the ones
already written that still fit (kept; damaged or misfitting ones are set aside to be
sampled again), the difficulty band, the bank's meta.json and its summary. Sampling the
missing shards is collect's (stopexp.stages.collect, with the loop of
stopexp.search.bank_sampling)."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from stopexp.runtime.artifacts import artifact_lock
from stopexp.runtime.integrity import set_aside
from stopexp.store import bank
from stopexp.metrics.answers import vote, vote_clusters

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


def summarize_bank(root: Path, answer_format: str | None = None) -> dict:
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


def settle(job, root: Path, task, shards: list, trusted: set[str], rank: int) -> list[int]:
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
        missing = write_meta(job, root, task, shards, good, missing)
        if missing:  # another job of an array may have finished meanwhile: never leave
            good = verified_shards(root, range(len(shards)), parts, want, set(good.values()))
            if len(good) == len(shards):  # a stale "incomplete" behind
                missing = write_meta(job, root, task, shards, good, [])
    return missing


def write_meta(job, root: Path, task, shards: list, good: dict[int, str],
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
        **({"split_rows": task.split_rows} if task.split_rows is not None else {})})
    return missing


