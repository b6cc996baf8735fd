"""Stage 1, collect: run the LM without pruning and fill the trace bank.

    python -m stopexp.collect +exp=toy_contrastive

For every prompt of the configured splits, N paths are sampled (the loop:
stopexp.search.bank_sampling); per path the tokens, text, answer, outcome and per-token
confidences are kept, and with collect.mc_rollouts a Monte Carlo success rate at each of
tap.checkpoints. An engine that taps hidden states while it generates (vLLM, engine.taps)
writes the tap's features beside the bank; otherwise `python -m stopexp.featurize` extracts
them from the stored tokens (train and evaluate require them). Shards are written
atomically; rerunning the same command resumes after the last finished one. The plan, the
shards kept and meta.json: stopexp.store.bank_plan. Shards that a bank differing in
collect.prompts alone already holds are linked from it, not sampled: stopexp.store.bank_growth.

Sharded over processes, each rank takes the shards whose index % world == rank:

    torchrun --nproc_per_node=2 -m stopexp.collect +exp=toy_contrastive
    python -m stopexp.collect -m collect.rank=0,1 collect.world=2 hydra/launcher=submitit_slurm
"""
from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from pathlib import Path

from stopexp.models.extract import StepEnds
from stopexp.runtime.artifacts import artifact_lock
from stopexp.runtime.ranks import barrier, in_group, join_group, leave_group, shard_of
from stopexp.search.bank_sampling import engine_facts, sample_shards
from stopexp.search.decode import SamplingParams
from stopexp.search.trace import has_values
from stopexp.stages import build
from stopexp.stages.cli import Stage, stage_main
from stopexp.stages.featurize import featurize
from stopexp.store import bank
from stopexp.store.bank_growth import grow
from stopexp.store.bank_plan import difficulty_filter, plan, plan_parts, settle, summarize_bank, verified_shards
from stopexp.store.tapped_features import all_tapped, write_tapped
from stopexp.tasks import build_task, vote_format
from stopexp.tasks.rewards import build_reward

log = logging.getLogger(__name__)


@stage_main("collect", tracked=False)
def main(stage: Stage) -> dict | None:
    cfg = stage.cfg
    rank, world = shard_of(cfg.collect)
    grouped = join_group()
    start = time.time()
    try:
        with build.tracked(cfg, "collect") if rank == 0 else nullcontext() as run:  # rank 0 logs
            result = collect(build.collection(cfg), rank, world, run=run)
    finally:
        leave_group()
    result["wall_s"] = round(time.time() - start, 1)
    log.info(log_line(result))
    if grouped and rank:  # the ranks of one launch share a run dir: rank 0 reports
        return None
    return {"collect": result}


def log_line(result: dict) -> str:
    """What this process wrote and where the bank stands (a rank that did not finish the
    bank has no bank-wide summary to report)."""
    linked = result.get("shards_linked", 0)
    mine = (f"rank {result['rank']}/{result['world']} wrote {result['shards_written']} shards "
            f"({result['paths_written']} paths) in {result['wall_s']:.0f}s"
            + (f" and linked {linked} from a bank with other collect.prompts" if linked else ""))
    if not result["complete"]:
        return (f"bank {result['bank']}: {mine}; the bank is incomplete "
                f"({result.get('shards_done', '?')} of {result['shards_total']} shards finished; "
                "the other ranks write the rest, and rerunning this command makes any missing)")
    if "paths" not in result:  # a non-zero rank of a launcher group: rank 0 summarizes
        return f"bank {result['bank']}: {mine}; rank 0 reports the bank's summary"
    return (f"bank {result['bank']} complete: {result['paths']} paths, per-path accuracy "
            f"{result['path_accuracy']:.3f}, vote accuracy {result['vote_accuracy']:.3f}, "
            + (f"mean reward {result['mean_reward']:.4f}, " if "mean_reward" in result else "")
            + f"{result['tokens_total']} tokens; {mine}")


def collect(job: build.Collection, rank: int = 0, world: int = 1, run=None) -> dict:
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
    linked = grow(job.bank, shards, pending, list(job.collect.prompts), rank, job.features) \
        if pending else {}
    pending = [i for i in pending if i not in linked]
    checkpoints = job.bank.checkpoints
    written, paths = _fill(job, root, task, shards, pending, rank, checkpoints) if pending else (set(), 0)
    # what this process did, for its log line (a rank that is not last sees no summary)
    mine = {"rank": rank, "world": world, "shards_written": len(pending), "paths_written": paths,
            "shards_linked": len(linked), "shards_total": len(shards)}
    grouped = in_group()
    if grouped:
        barrier()  # every rank's shards exist before rank 0 verifies them and writes meta
    if grouped and rank:
        barrier()  # rank 0 has written meta.json: report what it found
        complete, lost = bank.read_meta(root).get("complete", False), "see rank 0's log"
    else:
        missing = settle(job, root, task, shards, set(done.values()) | written | set(linked.values()),
                         rank)
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
    summary = summarize_bank(root, vote_format(job.task))
    if job.features is not None and all_tapped(job.features):
        featurize(job.features)  # their meta.json: no LM is loaded
    if run is not None:
        meta = bank.read_meta(root)
        run.summary_update({f"collect/{k}": v for k, v in summary.items()})
        run.log_artifact(root, name=f"traces-{root.name}", type="trace_bank",
                         metadata={**{k: v for k, v in meta.items() if k not in ("shards", "plan")},
                                   **summary})
        run.log({"collect/sample_paths": _sample_table(run, root)})
    return {"bank": str(root), "complete": True, **mine, **summary}


def _fill(job, root: Path, task, shards: list, pending: list[int], rank: int,
          checkpoints: list[int]) -> tuple[set[str], int]:
    """Sample and write the `pending` shards (Monte Carlo labels at `checkpoints`); returns
    the names written and the paths they hold."""
    reward = build_reward(job.reward) if job.reward.name != "correct" else None  # None: outcome
    params = SamplingParams.from_config(job.search, job.task, job.model.get("thinking"))
    log.info("collecting %d shards (%d prompts x %d paths) into %s", len(pending),
             sum(len(shards[i]) for i in pending), job.search.n_paths, root)
    paths, written = 0, set()
    tapped = {} if job.features is None else {"tap": job.features.tap,
                                              "positions": job.features.positions}
    with job.open_engine(params, **tapped) as (engine, model, tokenizer):
        facts = engine_facts(engine, model)
        feats = bank.path_columns(len(checkpoints), task.end_tag is not None, has_values(task),
                                 task.labels if task.mixed else None)
        step_end = StepEnds(tokenizer, job.features.positions["separator"]) if job.features else None
        for shard in sample_shards(engine, model, tokenizer, task, {i: shards[i] for i in pending},
                                   job, checkpoints, reward):
            start, i, cols = time.time(), shard.index, shard.cols
            name = bank.shard_name(i, rank)
            # metric values clipped into [0, 1] (rounding only: stopexp.metrics.bounds)
            clipped = {} if reward is None else {"rewards_clipped": shard.clipped}
            if shard.clipped:
                log.info("shard %s: %d rewards clipped into [0, 1] (rounding)", name, shard.clipped)
            kept = difficulty_filter(job.collect, cols)
            states = kept.pop("states", None)
            # the prompts left out, by cause: an empty split's error names the right one
            dropped = {"too_long": len(shards[i]) - len(shard.problems),
                       "filtered": len(set(cols["prompt_id"])) - len(set(kept["prompt_id"]))}
            seconds = shard.seconds + time.time() - start
            record = bank.write_shard(root, name, kept, feats,
                                      {"bank": root.name, "split": shards[i][0].split,
                                       "prompts": len(shards[i]), "tokens": shard.tokens,
                                       "seconds": seconds, **facts, **clipped, **dropped})
            if states is not None:
                write_tapped(job.features, name, kept, states, record, step_end,
                             list(engine.taps.layers), facts["hidden_size"],
                             shard.seconds + time.time() - start)
            written.add(name)
            paths += len(cols["length"])
    return written, paths


def _sample_table(run, root: Path, n: int = 20):
    ds = bank.load_bank(root)
    rows = [[ds["prompt"][i], ds["text"][i], bool(ds["correct"][i]), int(ds["length"][i]),
             ds["style"][i]] for i in range(min(n, len(ds)))]
    return run.table(["prompt", "text", "correct", "length", "style"], rows)
