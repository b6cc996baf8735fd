"""Growing a trace bank from the banks of its family, instead of sampling again.

A bank's key covers collect.prompts, so a collect with more (or fewer) prompts per split
makes another bank. Where a shard of the new bank holds the same prompts as a shard of a
bank that differs from it in collect.prompts alone (same LM, task, sampling, seed, labels:
its key is the new bank's with that bank's prompt counts), sampling it again would write the
same paths: a path's seed depends on the seed, its prompt and the path count, and a split's
prompts are the first n of its seeded draw, so the m-th shard of a split holds the same
prompts in both banks when it holds as many. Collect links such shards (hard links; a copy
where the file system has none) after checking every byte against the other bank's record;
featurize links their features the same way (`grown_features`). The shard's record names
where it came from (`grown_from`).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from stopexp.core.errors import writing
from stopexp.runtime.artifacts import publish_dir, staging_dir, write_json
from stopexp.store import bank
from stopexp.store.keys import BankSpec

log = logging.getLogger(__name__)

# what a bank of the family must record as this one does (a cheap filter before its key)
SAME = ("model_name", "n_paths", "seed", "mc_rollouts", "checkpoints")


def places(plan: list[dict]) -> dict[int, tuple[str, int, int]]:
    """plan index -> (split, its rank among the split's shards, prompts) of a bank's plan."""
    seen: dict[str, int] = {}
    out = {}
    for part in plan:
        m = seen.get(part["split"], 0)
        seen[part["split"]] = m + 1
        out[part["index"]] = (part["split"], m, part["prompts"])
    return out


def family(spec: BankSpec, splits: list[str]) -> list[tuple[Path, dict]]:
    """The other banks beside `spec`'s whose key is `spec`'s with their prompt counts (for
    the `splits` of the config), with their meta.json; nearest in size first."""
    if spec.key_with is None or not spec.root.parent.is_dir():
        return []
    found = []
    for meta_file in sorted(spec.root.parent.glob("*/meta.json")):
        root = meta_file.parent
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError):
            continue  # a damaged bank lends nothing
        if root == spec.root or not isinstance(meta, dict) or \
                any(meta.get(k) != spec.want.get(k) for k in SAME):
            continue
        counts = {s: 0 for s in splits}
        for part in meta.get("plan", []):
            if part.get("split") not in counts:
                break
            counts[part["split"]] += part.get("prompts", 0)
        else:
            if spec.key_with(counts) == root.name:
                found.append((root, meta))
    return sorted(found, key=lambda rm: -len(rm[1].get("shards", {})))


def grow(spec: BankSpec, shards: list[list], pending: list[int], splits: list[str],
         rank: int = 0) -> dict[int, str]:
    """Link into `spec`'s bank each of the `pending` shards of the plan `shards` that a bank
    of its family holds intact; returns plan index -> the name linked."""
    ours = places([{"index": i, "split": s[0].split, "prompts": len(s)} for i, s in enumerate(shards)])
    linked: dict[int, str] = {}
    for root, meta in family(spec, splits):
        theirs = {place: i for i, place in places(meta.get("plan", [])).items()}
        names = {bank.shard_index(n): n for n in meta.get("shards", {})}
        before = len(linked)
        for i in pending:
            name = names.get(theirs.get(ours[i], -1))
            if i in linked or name is None:
                continue
            record = meta["shards"][name]
            if bank.shard_problem(root / name, record, full=True) is not None:
                continue  # damaged there: sampled here
            mine = bank.shard_name(i, rank)
            link_shard(root / name, spec.root / mine, {
                **record, "index": i, "bank": spec.key, "grown_from": {"bank": root.name, "shard": name}})
            linked[i] = mine
        if len(linked) > before:
            log.info("trace bank %s: %d shards linked from the bank %s (the same paths; its "
                     "collect.prompts %s)", spec.key, len(linked) - before, root.name,
                     {s: sum(p["prompts"] for p in meta["plan"] if p["split"] == s) for s in splits})
    return linked


def grown_features(out: Path, name: str, bank_record: dict, donor_features: Path) -> dict | None:
    """Link the features of bank shard `name` of the features `out` from `donor_features`
    (the same features of the bank it was linked from), when they were made from the same
    bank files and are intact; returns the record written, else None."""
    grown = bank_record["grown_from"]
    source = donor_features / grown["shard"]
    record = bank.read_record(source) if source.is_dir() else None
    if record is None or record.get("bank_files") != bank_record["files"] or \
            bank.shard_problem(source, record, full=True) is not None:
        return None
    return link_shard(source, out / name, {**record, "index": bank.shard_index(name),
                                           "features": out.name, "grown_from": grown})


def link_shard(source: Path, final: Path, record: dict) -> dict:
    """Publish `source`'s recorded files at `final` with `record` as its shard.json
    (atomically, as bank.write_shard); returns the record in place."""
    tmp = staging_dir(final)
    try:
        with writing(final):
            for file in record["files"]:
                try:
                    os.link(source / file, tmp / file)
                except OSError:  # another file system, or one without hard links
                    shutil.copy2(source / file, tmp / file)
            write_json(tmp / bank.MANIFEST, record)
            if not publish_dir(tmp, final):
                return bank.read_record(final) or record
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record
