"""Stage 1, collect: run the LM without pruning and fill the trace bank.

    python -m stopexp.collect +exp=toy_contrastive

For every prompt of the configured splits, N paths are sampled; per path the tokens,
text, answer, outcome and per-token confidences are kept, per checkpoint the tap
features, the non-learnable signals and optionally a Monte Carlo success rate. Shards
are written atomically; rerunning the same command resumes after the last finished one.

Sharded over processes, each rank takes the shards whose index % world == rank:

    torchrun --nproc_per_node=2 -m stopexp.collect +exp=toy_contrastive
    python -m stopexp.collect -m collect.rank=0,1 collect.world=2 hydra/launcher=submitit_slurm
"""
from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from stopexp import bank
from stopexp.artifacts import write_json
from stopexp.config import validate
from stopexp.ranks import barrier, in_group, join_group, leave_group, shard_of
from stopexp.tracking import tracked_run

log = logging.getLogger(__name__)


def plan(cfg, task) -> list[list]:
    """The shards of the collection: lists of problems, split by split, in a fixed order."""
    shards = []
    for split, n in cfg.collect.prompts.items():
        problems = task.problems(split, n) if n else []
        size = cfg.collect.shard_prompts
        shards += [problems[i : i + size] for i in range(0, len(problems), size)]
    return shards


def is_complete(root: Path, n_shards: int) -> bool:
    return {bank.shard_index(n) for n in bank.finished_shards(root)} >= set(range(n_shards))


def difficulty_filter(cfg, cols: dict) -> dict:
    """Keep the prompts whose number of correct paths lies in collect.keep_correct."""
    band = cfg.collect.keep_correct
    if band is None or not cols["split"] or cols["split"][0] not in cfg.collect.keep_correct_splits:
        return cols
    prompts = np.asarray(cols["prompt_id"])
    correct = np.asarray(cols["correct"])
    keep_ids = [p for p in np.unique(prompts) if band[0] <= correct[prompts == p].sum() <= band[1]]
    mask = np.isin(prompts, keep_ids)
    return {k: [v for v, m in zip(vals, mask) if m] for k, vals in cols.items()}


def summarize(root: Path) -> dict:
    """Per-path and vote accuracy, tokens and sanity counts over the whole bank."""
    from stopexp.search.sample import vote

    ds = bank.load_bank(root)
    correct = np.asarray(ds["correct"][:])
    keys = np.asarray([f"{s}/{p}" for s, p in zip(ds["split"][:], ds["prompt_id"][:])])
    answers = np.asarray(ds["answer"][:])
    votes = []
    for key in np.unique(keys):
        sel = keys == key
        winner = vote([a or None for a in answers[sel]])
        votes.append(winner is not None and correct[sel][answers[sel] == winner].any())
    hidden = ds["hidden"][:]
    signals = ds["signals"][:]
    return {"paths": int(len(correct)), "prompts": int(len(votes)),
            "path_accuracy": float(correct.mean()), "vote_accuracy": float(np.mean(votes)),
            "tokens_total": int(np.asarray(ds["length"][:]).sum()),
            "nonfinite_features": int((~np.isfinite(hidden)).sum()),
            "nonfinite_signals": int((~np.isfinite(signals)).sum())}


def collect(cfg, rank: int = 0, world: int = 1, run=None) -> dict:
    """Fill the bank for `cfg` (this rank's shards); returns the summary of the bank."""
    from stopexp.models import load_lm
    from stopexp.search.decode import Engine, SamplingParams
    from stopexp.search.sample import row_cap
    from stopexp.search.trace import trace_problems
    from stopexp.taps import Taps
    from stopexp.tasks import build_task

    root = bank.bank_dir(cfg)
    task = build_task(cfg.task)
    shards = plan(cfg, task)
    todo = [i for i in range(len(shards)) if i % world == rank]
    done = {bank.shard_index(n) for n in bank.finished_shards(root)}
    pending = [i for i in todo if i not in done]
    checkpoints = bank.checkpoints_of(cfg)
    paths = 0
    if pending:
        model, tokenizer = load_lm(cfg)
        params = SamplingParams.from_config(cfg.search)
        hidden = model.config.get_text_config().hidden_size
        n_prompts = sum(len(shards[i]) for i in pending)
        log.info("collecting %d shards (%d prompts x %d paths) into %s; %d already there",
                 len(pending), n_prompts, cfg.search.n_paths, root, len(todo) - len(pending))
        start, tokens = time.time(), 0
        with Taps(model, list(cfg.tap.layers), cfg.tap.pooling) as taps, \
                tqdm(total=n_prompts, unit="prompt", desc="collect") as bar:
            engine = Engine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, params,
                            taps, checkpoints)
            feats = bank.features(len(checkpoints), len(taps.layers), hidden)
            for i in pending:
                cols, mc_tokens = trace_problems(engine, tokenizer, task, shards[i], cfg.search.n_paths,
                                      cfg.seed, checkpoints, cfg.collect.mc_rollouts,
                                      cfg.search.group_window, len(taps.layers), hidden,
                                      row_cap(cfg, tokenizer, shards[i]))
                paths += len(cols["length"])
                tokens += int(sum(cols["length"])) + mc_tokens
                bank.write_shard(root, bank.shard_name(i, rank), difficulty_filter(cfg, cols), feats)
                bar.update(len(shards[i]))
                rate = time.time() - start
                bar.set_postfix(paths_s=f"{paths / rate:.0f}", tok_s=f"{tokens / rate:.0f}")
        measured = {"seconds_per_token": (time.time() - start) / max(tokens, 1),
                    "lm_parameters": sum(p.numel() for p in model.parameters()),
                    "hidden_size": hidden, "tap_layers": taps.layers}
    else:
        measured = {}
    # what this process did, for its log line (a rank that is not last sees no summary)
    mine = {"rank": rank, "world": world, "shards_written": len(pending), "paths_written": paths,
            "shards_total": len(shards)}
    if in_group():
        barrier()  # every rank's shards exist before rank 0 writes the final meta
        if rank:
            return {"bank": str(root), "complete": True, **mine}
    complete = is_complete(root, len(shards))
    if rank == 0 or complete:
        _write_meta(cfg, root, task, checkpoints, complete, measured)
        if not complete and is_complete(root, len(shards)):
            # another job of an array finished meanwhile: never leave a stale "incomplete"
            complete = True
            _write_meta(cfg, root, task, checkpoints, complete, measured)
    summary = summarize(root) if complete else {}
    if run is not None and complete:
        run.summary_update({f"collect/{k}": v for k, v in summary.items()})
        run.log_artifact(root, name=f"traces-{root.name}", type="trace_bank",
                         metadata={**bank.read_meta(root), **summary})
        run.log({"collect/sample_paths": _sample_table(run, root)})
    mine["shards_done"] = len(bank.finished_shards(root))
    return {"bank": str(root), "complete": complete, **mine, **summary}


def _write_meta(cfg, root: Path, task, checkpoints, complete: bool, measured: dict) -> None:
    """The bank's metadata. Sizes come from the loaded model when this process loaded it,
    else from an earlier meta.json, else from the config (a rank that had nothing to do)."""
    old = bank.read_meta(root) if (root / "meta.json").exists() else {}
    size = cfg.model.toy if cfg.model.toy is not None else cfg.model
    n_layers = getattr(size, "num_layers", None)
    known = {"hidden_size": size.hidden_size,
             "tap_layers": [i % n_layers for i in cfg.tap.layers] if n_layers else None}
    keys = ("seconds_per_token", "lm_parameters", "hidden_size", "tap_layers")
    known.update({k: old[k] for k in keys if k in old})
    known.update(measured)
    bank.write_meta(root, {
        "key": root.name, "complete": complete, "model_name": cfg.model.name,
        "pooling": cfg.tap.pooling,
        "checkpoints": checkpoints, "signal_names": list(bank.SIGNAL_NAMES),
        "n_paths": cfg.search.n_paths, "task": OmegaConf.to_container(cfg.task),
        "seed": cfg.seed, "mc_rollouts": cfg.collect.mc_rollouts,
        "version": bank.BANK_VERSION, **known,
        # which source rows form each split (file-based tasks), fixed by task.seed
        **({"split_rows": task.split_rows} if hasattr(task, "split_rows") else {})})


def _sample_table(run, root: Path, n: int = 20):
    ds = bank.load_bank(root)
    rows = [[ds["prompt"][i], ds["text"][i], bool(ds["correct"][i]), int(ds["length"][i]),
             ds["style"][i]] for i in range(min(n, len(ds)))]
    return run.table(["prompt", "text", "correct", "length", "style"], rows)


@hydra.main(config_path="../conf", config_name="collect", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    validate(cfg)
    from hydra.core.hydra_config import HydraConfig

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    rank, world = shard_of(cfg)
    grouped = join_group()
    start = time.time()
    try:
        with tracked_run(cfg, "collect") if rank == 0 else nullcontext() as run:  # rank 0 logs
            result = collect(cfg, rank, world, run=run)
    finally:
        leave_group()
    result["wall_s"] = round(time.time() - start, 1)
    if grouped and rank:  # the ranks of one launch share a run dir: rank 0 reports
        log.info(log_line(result))
        return result
    write_json(run_dir / "metrics.json", {"collect": result})
    log.info(log_line(result))
    return result


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
            f"{result['tokens_total']} tokens; {mine}")


if __name__ == "__main__":
    main()
