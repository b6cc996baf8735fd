"""The trace bank: every collected path as generation produced it, with its labels.

Per path: tokens, text, answer, outcome, its reward (`reward=`), where its first wrong
intermediate value appears (`first_wrong_value`, tasks that have them), per-token log-prob /
entropy / confidence, the prompt's length in tokens and, when collect ran Monte Carlo
rollouts, the mean reward of the rollouts at each of `tap.checkpoints`. Hidden features are
not here: they are a second artifact made from the stored tokens (`stopexp.store.feature_sets`),
so a tap change never regenerates paths.

An HF `datasets` Arrow store with explicit features (fixed-shape float32 arrays), written
in shards. Each shard is saved under a temporary name and renamed into place, so a crash
never leaves half a shard; a rerun skips the shards already there. Shard names carry the
rank of the process that wrote them, and loading sorts them, so the order of paths is
the same whichever process wrote what.

The bank lives in `<cache>/traces/<hash>`, where the hash covers every config section that
changes its content (for a file-based task, the file's content too); `meta.json` records
what a consumer needs to check it fits, and what the bank must hold: the shard plan and,
per shard, its rows and the size and SHA-256 of every file (each shard also carries that
record in its own `shard.json`, written with it). Consumers verify the bank against that
record on load (sizes, and the checksum of small files and of sampled blocks of large
ones: milliseconds) and name any damaged shard with the command that repairs it; collect
verifies every byte and recomputes what is damaged or missing.
"""
from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from datasets import ClassLabel, Dataset, Features, List, Value, concatenate_datasets, load_from_disk
from datasets.utils.logging import disable_progress_bar

from stopexp.core.commands import make_with, stage_command
from stopexp.core.errors import UserError, error_text, writing
from stopexp.runtime.artifacts import publish_dir, staging_dir, write_json
from stopexp.runtime.integrity import dir_problem, records
from stopexp.store.bank_records import MANIFEST, meta_problem, read_record
from stopexp.store.keys import BANK_VERSION, BankSpec

disable_progress_bar()  # one bar per shard save would drown the collect progress bar

REPAIR = ("rerun the collect command that made it (python -m stopexp.collect with the same "
          "overrides); it recomputes damaged or missing shards and rewrites meta.json")


class BankMissing(UserError, FileNotFoundError):
    """No trace bank for this config; the message gives the command that makes it."""


class BankDamaged(BankMissing):
    """A bank whose files differ from what it records (a shard missing, truncated or
    altered, or meta.json unreadable); the message names them and the repair."""


class ArtifactMismatch(BankDamaged):
    """An artifact whose own record (meta.json) says it was made for something other than
    the config at hand (another model, width, tap, bank, ...): another artifact put in its
    place, or an edited record. The message names the field, both values and the repair."""


def misfit(meta: dict, want: dict) -> str | None:
    """The first field of `want` that `meta` records otherwise, as a phrase, or None."""
    for field, value in want.items():
        value = json.loads(json.dumps(value))  # tuples as lists, as meta.json holds them
        if meta.get(field) != value:
            return f"its meta.json records {field}={meta.get(field)!r}, this config expects {value!r}"
    return None


def check_fit(kind: str, root: Path, meta: dict, want: dict, repair: str) -> None:
    """Refuse (ArtifactMismatch) an artifact whose record differs from `want` in a field."""
    problem = misfit(meta, want)
    if problem:
        raise ArtifactMismatch(f"{kind} {root} does not fit this config: {problem}; repair: {repair}")


# what collect measures on the loaded LM and no two shards of one bank differ in (the dtype
# may: model.dtype=auto on the machines of an array job)
MEASURED = ("hidden_size", "num_layers")


def shard_misfit(root: Path, name: str, rec: dict, plan: dict[int, dict], want: dict) -> str | None:
    """Why a bank shard's own record says it belongs elsewhere: written for another bank,
    holding another part of the plan (`plan`: index -> its split and prompts), or measured
    on an LM of another width or depth than `want` records; None when it fits."""
    if rec.get("bank", root.name) != root.name:  # a record without the field: judged by the plan
        return f"shard {name} was written for the bank {rec['bank']}"
    part = plan.get(shard_index(name))
    if part is None or (rec.get("split"), rec.get("prompts")) != (part["split"], part["prompts"]):
        return (f"shard {name} holds {rec.get('prompts')} {rec.get('split')} prompts, the plan "
                + (f"{part['prompts']} {part['split']} ones" if part else "no such shard"))
    for k in MEASURED:
        if k in rec and k in want and rec[k] != want[k]:
            return f"shard {name} records {k}={rec[k]!r}, {want[k]!r} expected"
    return None


def path_columns(n_checkpoints: int, thinking=False, wrong_values=False, tasks=None) -> Features:
    """The bank's columns; `mc` holds one rate per Monte Carlo checkpoint (none without
    rollouts); a thinking model's bank also counts each path's thinking tokens
    (`thinking_tokens`: stopexp.tasks.thinking.thinking_length), and the bank of a task with
    intermediate values where each path first writes a wrong one (`first_wrong_value`:
    tokens up to it, -1 none; stopexp.search.trace.first_wrong_value), and a mixture's bank
    each path's task (`task`: a ClassLabel over its components' labels, `tasks`)."""
    f32 = Value("float32")
    return Features({
        **({"thinking_tokens": Value("int32")} if thinking else {}),
        **({"first_wrong_value": Value("int32")} if wrong_values else {}),
        **({"task": ClassLabel(names=list(tasks))} if tasks else {}),
        "split": Value("string"), "prompt_id": Value("int32"), "prompt": Value("string"),
        "prompt_len": Value("int32"), "path_id": Value("int32"), "tokens": List(Value("int32")), "text": Value("string"),
        "answer": Value("string"), "correct": Value("bool"), "reward": Value("float32"),
        "length": Value("int32"),
        "finished": Value("bool"), "style": Value("string"), "first_error": Value("int32"),
        "token_logprob": List(f32), "token_entropy": List(f32), "token_conf": List(f32),
        "mc": List(f32, length=n_checkpoints) if n_checkpoints else List(f32),  # arrow: no 0-length lists
    })


def shard_name(index: int, rank: int = 0) -> str:
    """Shards sort by their index in the collection plan, whichever rank wrote them."""
    return f"shard-{index:05d}-r{rank:03d}"


def shard_index(name: str) -> int:
    return int(name.split("-")[1])


# ---- shards ------------------------------------------------------------------------------
def write_shard(root: Path, name: str, rows: dict, feats: Features, info: dict | None = None) -> dict:
    """Save one shard atomically (temp dir + rename) with its record (`shard.json`: index,
    split, rows, per-file size and SHA-256, and `info`); returns the record of the shard now
    in place: this one's, or, when a concurrent writer published the same shard first, that
    writer's (its files and timings differ from this copy's, which is dropped)."""
    with staged_shard(root / name) as tmp:
        n = len(rows["length"])
        with writing(root / name):  # a full disk names the shard, not its temporary dir
            if n:  # else every prompt was filtered out: the shard is done but holds nothing
                Dataset.from_dict(rows, features=feats).save_to_disk(str(tmp))
        splits = sorted(set(rows["split"]))
        record = {"index": shard_index(name), "rows": n,
                  "splits": {s: rows["split"].count(s) for s in splits},
                  "files": records(tmp), **(info or {})}
        return publish_shard(tmp, root / name, record)


@contextmanager
def staged_shard(final: Path):
    """A temporary directory beside shard `final` to fill, removed if anything fails."""
    tmp = staging_dir(final)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish_shard(tmp: Path, final: Path, record: dict) -> dict:
    """Write `record` into the filled `tmp` and rename it to `final`; the record of the
    shard now in place (a concurrent writer's when it published first)."""
    with writing(final):
        write_json(tmp / MANIFEST, record)
        if publish_dir(tmp, final):
            return record
    record = read_record(final)
    if record is None:  # removed again meanwhile: nothing in place to record
        raise BankDamaged(f"{final.parent}: shard {final.name}, published by a concurrent "
                          "writer, was removed before it could be read; rerun the command")
    return record


def shard_dirs(root: Path) -> dict[int, list[str]]:
    """Published shard directories by plan index (temporary dirs start with a dot)."""
    out: dict[int, list[str]] = {}
    for p in sorted(root.glob("shard-*")) if root.is_dir() else []:
        out.setdefault(shard_index(p.name), []).append(p.name)
    return out


def finished_shards(root: Path) -> set[str]:
    """Names of the shards published with a readable record (not checked against it)."""
    return {n for names in shard_dirs(root).values() for n in names
            if read_record(root / n) is not None}


def shard_problem(shard: Path, record: dict | None = None, full: bool = False) -> str | None:
    """Why a shard differs from `record` (default: its own `shard.json`), or None."""
    if not shard.is_dir():
        return "missing"
    own = read_record(shard)
    if own is None:
        return f"{MANIFEST} is missing, unreadable or malformed"
    record = record or own
    if own != record:
        return f"{MANIFEST} differs from the bank's record (another shard put in its place?)"
    return dir_problem(shard, record["files"], full)


# ---- meta.json and verification ----------------------------------------------------------
def write_meta(root: Path, meta: dict) -> None:
    write_json(root / "meta.json", meta)


def read_meta(root: Path, repair: str = REPAIR, kind: str = "trace bank") -> dict:
    """The artifact's meta.json; BankMissing when there is none, BankDamaged when unreadable
    (both messages name the `kind` of artifact and end with `repair`)."""
    path = Path(root) / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise BankMissing(f"{kind} {root} has no meta.json; repair: {repair}") from None
    except (ValueError, OSError) as e:
        raise BankDamaged(f"{kind} {root}: meta.json is unreadable ({error_text(e)}); "
                          f"repair: {repair}") from e
    if not isinstance(meta, dict):
        raise BankDamaged(f"{kind} {root}: meta.json is not a JSON object; repair: {repair}")
    return meta


def verify_bank(root: Path, full: bool = False, repair: str = REPAIR, kind: str = "trace bank",
                version: int = BANK_VERSION) -> dict:
    """Check a sharded artifact (a trace bank, or with `kind`/`version` the features)
    against its own record: complete, every recorded shard present and its files of the
    recorded sizes and checksums (cheap: small files whole, sampled blocks of large ones;
    `full`: every byte). Returns meta.json's content.

    Raises BankMissing (not complete: which shards are missing) or BankDamaged (which
    shards or files differ, and why); both say how to repair (`repair`)."""
    root = Path(root)
    meta = read_meta(root, repair, kind)
    if meta.get("version") != version or "shards" not in meta:
        raise BankDamaged(f"{kind} {root} was written by another version of stopexp "
                          f"({kind} version {meta.get('version')}, {version} expected"
                          + ("; since version 4 a bank holds the paths only and the hidden "
                             "features are a separate artifact" if kind == "trace bank" else "")
                          + f"); repair: {repair}")
    if malformed := meta_problem(meta):
        raise BankDamaged(f"{kind} {root}: meta.json is malformed ({malformed}); repair: {repair}")
    if not meta.get("complete"):
        missing = meta.get("missing", [])
        raise BankMissing(f"{kind} {root} is incomplete ({len(missing)} of "
                          f"{len(meta.get('plan', []))} shards missing: indices "
                          f"{brief(missing)}); repair: {repair}")
    damaged = {}
    for name, record in meta["shards"].items():
        problem = shard_problem(root / name, record, full)
        if problem:
            damaged[name] = problem
    if damaged:
        raise BankDamaged(f"{kind} {root} is damaged: "
                          + "; ".join(f"{n}: {p}" for n, p in sorted(damaged.items()))
                          + f"; repair: {repair}")
    return meta


def brief(items: list, n: int = 10) -> str:
    """The first `n` items, comma-separated, and how many more (for messages)."""
    return ", ".join(map(str, items[:n])) + (f" and {len(items) - n} more" if len(items) > n else "")


def shards_holding(meta: dict, split: str | None) -> list[str]:
    """The shards (in load order) whose rows `load_bank(root, split)` reads: those holding
    paths of `split` (all with paths for None); when none does, the first with paths, so
    an empty split still has the bank's columns. The features use the same order."""
    names = sorted(n for n, rec in meta["shards"].items()
                   if rec["rows"] and (split is None or rec["splits"].get(split)))
    return names or sorted(n for n, rec in meta["shards"].items() if rec["rows"])[:1]


def load_bank(root: Path, split: str | None = None) -> Dataset:
    """The paths of a complete, verified bank (shards in name order), optionally of one
    split, numpy-formatted. Raises BankMissing / BankDamaged naming the shard at fault."""
    root = Path(root)
    meta = verify_bank(root)
    names = shards_holding(meta, split)
    if not names:
        raise BankMissing(f"trace bank {root} holds no paths: {left_out(meta)}")
    parts = []
    for name in names:
        try:
            ds = load_from_disk(str(root / name))
        except Exception as e:  # pyarrow / datasets name no file: say which shard it was
            raise BankDamaged(f"trace bank {root}: shard {name} cannot be read "
                              f"({error_text(e)}); repair: {REPAIR}") from e
        if len(ds) != meta["shards"][name]["rows"]:
            raise BankDamaged(f"trace bank {root}: shard {name} holds {len(ds)} rows, "
                              f"{meta['shards'][name]['rows']} recorded; repair: {REPAIR}")
        parts.append(ds)
    ds = concatenate_datasets(parts)
    if split is not None:
        idx = np.nonzero(np.asarray(ds["split"][:]) == split)[0]
        ds = ds.select(idx)
    return ds.with_format("numpy")


def split_rows(meta: dict, split: str) -> int:
    """How many paths of `split` the bank holds (from its record, nothing loaded)."""
    return sum(rec["splits"].get(split, 0) for rec in meta["shards"].values())


def left_out(meta: dict, split: str | None = None) -> str:
    """Why the bank (or its `split`) holds no paths: the prompts its shards' records say
    were left out, by cause (model.long_prompts=skip, the difficulty filter)."""
    parts = meta.get("plan", [])
    plan = {p.get("index"): p for p in parts}
    recs = [r for n, r in meta["shards"].items()  # a record naming no split: the plan does
            if split is None or r.get("split", plan.get(shard_index(n), {}).get("split")) == split]
    planned = sum(p["prompts"] for p in parts if split is None or p["split"] == split) \
        if parts else sum(r.get("prompts", 0) for r in recs)
    which = f"{split} prompts" if split else "prompts"
    if not any("too_long" in r for r in recs):  # records that do not count the causes
        return (f"all {planned} {which} were left out, by model.long_prompts=skip (longer than "
                "model.max_prompt_tokens) or by the difficulty filter collect.keep_correct")
    causes = [(sum(r.get("too_long", 0) for r in recs),
               "longer than the prompt limit (model.max_prompt_tokens, model.long_prompts=skip): "
               "allow longer prompts or shorten them"),
              (sum(r.get("filtered", 0) for r in recs),
               "outside the difficulty filter collect.keep_correct: widen it")]
    return f"all {planned} {which} were left out: " + "; ".join(
        f"{n} {why}" for n, why in causes if n)


def planned_prompts(meta: dict, split: str) -> int:
    """How many prompts of `split` collect was asked for (before the difficulty filter)."""
    return sum(p["prompts"] for p in meta.get("plan", []) if p["split"] == split)


def require_bank(spec: BankSpec, overrides: list[str] | None = None) -> Path:
    """The bank of `spec`, verified (cheaply) against its record, and its record against
    the config (`spec.want`) and its shards' records (`shard_misfit`), or an error that
    names what is missing, damaged or misfitting and prints the collect command."""
    root = spec.root
    if not (root / "meta.json").exists():
        raise BankMissing(f"no complete trace bank for this config at {root}; "
                          + make_with("collect", overrides))
    repair = (f"{stage_command('collect', overrides)} (collect recomputes only the damaged, missing "
              "or misfitting shards and rewrites meta.json; the pipeline does too)")
    meta = verify_bank(root, repair=repair)
    check_fit("trace bank", root, meta, spec.want, repair)
    plan = {p["index"]: p for p in meta.get("plan", [])}
    measured = {k: meta.get(k) for k in MEASURED}  # the bank's record and its shards' agree
    for name, rec in sorted(meta["shards"].items()):
        problem = shard_misfit(root, name, rec, plan, measured)
        if problem:
            raise ArtifactMismatch(f"trace bank {root} does not fit its own record: {problem}; "
                                   f"repair: {repair}")
    return root


def rewards_of(ds: Dataset) -> np.ndarray:
    """(P,) float32 reward of every path; a bank without the reward column (answers-only
    banks) holds outcomes only, whose reward is the outcome (0/1)."""
    if "reward" in ds.column_names:
        return np.asarray(ds["reward"][:], dtype=np.float32)
    return np.asarray(ds["correct"][:]).astype(np.float32)


def prefix_columns(ds: Dataset) -> dict:
    """Each path's prompt and generated ids, for predictors that re-encode the prefix (the
    super token); object arrays, so `select_rows` indexes them like the tensors."""
    tokens = np.empty(len(ds), dtype=object)
    tokens[:] = [np.asarray(t) for t in ds["tokens"][:]]
    return {"prompt": np.asarray(ds["prompt"][:], dtype=object), "tokens": tokens}


def select_rows(batch: dict, rows) -> dict:
    return {k: v[rows] for k, v in batch.items()}


def main(argv: list[str] | None = None) -> int:
    """`python -m stopexp.store.bank DIR [--full]`: verify a bank; exit 1 naming what is wrong."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m stopexp.store.bank", description=main.__doc__)
    ap.add_argument("bank", type=Path, help="the bank directory (<cache>/traces/<hash>)")
    ap.add_argument("--full", action="store_true", help="checksum every byte, not samples")
    args = ap.parse_args(argv)
    try:
        meta = verify_bank(args.bank, full=args.full)
    except BankMissing as e:
        print(e)
        return 1
    rows = sum(r["rows"] for r in meta["shards"].values())
    print(f"{args.bank}: complete, {len(meta['shards'])} shards, {rows} paths, "
          f"{'every byte' if args.full else 'sizes and sampled checksums'} as recorded")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
