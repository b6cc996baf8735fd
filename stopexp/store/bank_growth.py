"""Growing a trace bank from the banks of its family, instead of sampling again.

A bank's key covers collect.prompts, so a collect with more (or fewer) prompts per split
makes another bank. Where a shard of the new bank holds the same prompts as a shard of a
bank that differs from it in collect.prompts alone (same LM, task, sampling, seed, labels:
its key is the new bank's with that bank's prompt counts), sampling it again would draw the
same paths (up to the engine's numerics: vLLM in bfloat16 moves a few tokens even on a
rerun): a path's seed depends on the seed, its prompt and its index, and a split's prompts
are the first n of its seeded draw, so the m-th shard of a split holds the same prompts in
both banks when it holds as many. Collect links such shards (hard links; a copy where the
file system has none), checks every byte linked against the other bank's record, and
samples a shard whose link fails; featurize, or a collect that taps in the engine, links
their features the same way when that bank's are there and were made the same way (in the
engine or by featurize's forward). A linked shard's record names where it came from
(`grown_from`). Hard-linked files are shared: damage to one shows in both banks, and each
bank's collect (or featurize) repairs its own, with new files.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from stopexp.runtime.integrity import dir_problem, set_aside
from stopexp.store import bank
from stopexp.store.bank_plan import plan_parts
from stopexp.store.feature_sets import FeatureSet, feature_key
from stopexp.store.keys import BankSpec

log = logging.getLogger(__name__)

# what a bank of the family must record as this one does (a cheap filter before its key)
SAME = ("model_name", "n_paths", "seed", "mc_rollouts", "checkpoints")


class LinkFailed(OSError):
    """What was linked differs from its record (the other bank changed meanwhile)."""


def places(plan: list[dict]) -> dict[int, tuple[str, int, int]]:
    """plan index -> (split, its rank among the split's shards, prompts) of a bank's plan."""
    seen: dict[str, int] = {}
    out = {}
    for part in plan:
        m = seen.get(part["split"], 0)
        seen[part["split"]] = m + 1
        out[part["index"]] = (part["split"], m, part["prompts"])
    return out


def family(spec: BankSpec, splits: list[str]) -> list[tuple[Path, dict, dict]]:
    """The other banks beside `spec`'s whose key is `spec`'s with their prompt counts (for
    the `splits` of the config): (root, meta.json, what it lends: `lends`), the most shards
    first. A bank lends its shards once collect has written its meta.json."""
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
        try:
            for part in meta["plan"]:
                counts[part["split"]] += part["prompts"]  # a split this config lacks: KeyError
            shards = lends(meta)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            continue  # another family, or a meta.json not written by collect
        if spec.key_with(counts) == root.name:
            found.append((root, meta, shards))
    return sorted(found, key=lambda bank_found: -len(bank_found[2]))


def lends(meta: dict) -> dict[tuple[str, int, int], str]:
    """(split, rank among the split's shards, prompts) -> the name of each shard a bank's
    meta.json records."""
    where = places(meta["plan"])
    return {where[bank.shard_index(name)]: name for name in meta["shards"]}


def grow(spec: BankSpec, shards: list[list], pending: list[int], splits: list[str],
         rank: int = 0, features: FeatureSet | None = None) -> dict[int, str]:
    """Link into `spec`'s bank each of the `pending` shards of the plan `shards` that a bank
    of its family holds intact; with `features` (tapped in the engine as collect samples),
    only shards whose features that bank also holds, linked too. Returns plan index -> the
    name linked."""
    ours = places([{"index": i, **part} for i, part in plan_parts(shards).items()])
    linked: dict[int, str] = {}
    for root, meta, theirs in family(spec, splits):
        before = len(linked)
        for i in pending:
            name = theirs.get(ours[i])
            if i in linked or name is None:
                continue
            mine = bank.shard_name(i, rank)
            record = {**meta["shards"][name], "index": i, "bank": spec.key,
                      "grown_from": {"bank": root.name, "shard": name}}
            try:
                link_shard(root / name, spec.root / mine, record)
            except (OSError, KeyError, TypeError) as err:  # sampled here instead
                log.warning("trace bank %s: shard %s of the bank %s is not linked (%s); it is "
                            "sampled", spec.key, name, root.name, err)
                continue
            if features is not None and grown_features(
                    features, mine, record, donor_features(features, root.name)) is None:
                set_aside(spec.root / mine)  # its features would come from another pass: sample it
                continue
            linked[i] = mine
        if len(linked) > before:
            log.info("trace bank %s: %d shards linked from the bank %s (the same prompts; its "
                     "collect.prompts %s)", spec.key, len(linked) - before, root.name,
                     {s: sum(p["prompts"] for p in meta["plan"] if p["split"] == s) for s in splits})
    return linked


def donor_features(features: FeatureSet, bank_key: str) -> Path:
    """Where the features of `features`' tap over the bank `bank_key` live."""
    return features.root.parent / feature_key(bank_key, features.tap, features.positions,
                                              features.numerics)


def grown_features(features: FeatureSet, name: str, bank_record: dict, donor: Path) -> dict | None:
    """Link the features of bank shard `name` (its record `bank_record`, linked from another
    bank) into `features` from `donor` (the same features of that bank), when they were
    made from the same bank files, for those features, in the same way (in the engine or by
    featurize: `features.in_engine`), and are intact; returns the record written, else None."""
    source = donor / bank_record["grown_from"]["shard"]
    record = bank.read_record(source) if source.is_dir() else None
    if record is None or record.get("bank_files") != bank_record["files"] \
            or record.get("features") != donor.name or ("tapped" in record) != features.in_engine:
        return None
    try:
        return link_shard(source, features.root / name, {
            **record, "index": bank.shard_index(name), "features": features.key,
            "grown_from": bank_record["grown_from"]})
    except (OSError, KeyError, TypeError) as err:
        log.warning("features %s: shard %s is not linked from %s (%s); it is computed",
                    features.key, name, donor.name, err)
        return None


def link_shard(source: Path, final: Path, record: dict) -> dict:
    """Publish `source`'s recorded files at `final` with `record` as its shard.json
    (atomically, as bank.write_shard), each byte checked against the record first
    (LinkFailed where one differs); returns the record in place."""
    with bank.staged_shard(final) as tmp:
        for file in record["files"]:
            try:
                os.link(source / file, tmp / file)
            except OSError:  # another file system, or one without hard links
                shutil.copy2(source / file, tmp / file)
        problem = dir_problem(tmp, record["files"], full=True)
        if problem is not None:
            raise LinkFailed(problem)
        return bank.publish_shard(tmp, final, record)
