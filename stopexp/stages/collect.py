"""Stage 1, collect: run the LM without pruning and fill the trace bank.

    python -m stopexp.collect +exp=toy_contrastive

For every prompt of the configured splits, N paths are sampled; per path the tokens,
text, answer, outcome and per-token confidences are kept, and with collect.mc_rollouts a
Monte Carlo success rate at each of tap.checkpoints. No taps run: hidden features are
extracted from the stored tokens by `python -m stopexp.featurize` (train and evaluate make
them when missing). Shards are written atomically; rerunning the same command resumes
after the last finished one.

Sharded over processes, each rank takes the shards whose index % world == rank:

    torchrun --nproc_per_node=2 -m stopexp.collect +exp=toy_contrastive
    python -m stopexp.collect -m collect.rank=0,1 collect.world=2 hydra/launcher=submitit_slurm
"""
from __future__ import annotations

import logging
import time
from contextlib import nullcontext

from stopexp.runtime.ranks import join_group, leave_group, shard_of
from stopexp.stages import build
from stopexp.stages.cli import Stage, stage_main
from stopexp.store.bank_fill import collect

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
    mine = (f"rank {result['rank']}/{result['world']} wrote {result['shards_written']} shards "
            f"({result['paths_written']} paths) in {result['wall_s']:.0f}s")
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
