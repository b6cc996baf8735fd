"""The shapes of a trace bank's records (a shard's `shard.json`, and meta.json's record of
the shards and the plan) as collect writes them: a record read back in another shape
(edited, or garbled into valid JSON) is damage to repair, never a value to compute with."""
from __future__ import annotations

import json
from pathlib import Path

from stopexp.runtime.integrity import is_count, records_problem

MANIFEST = "shard.json"  # a shard's own record, in its directory


def record_problem(rec) -> str | None:
    """Why a shard's record (its `shard.json`, or its entry in meta.json) is not one that
    `write_shard` writes, or None: its rows and per-split rows whole numbers, its files a
    map of records (`records_problem`). A record edited or garbled into another shape is
    damage (see the module doc)."""
    if not isinstance(rec, dict):
        return f"it is {type(rec).__name__}, an object expected"
    if not is_count(rec.get("rows")):
        return f"it records rows={rec.get('rows')!r}, a whole number expected"
    splits = rec.get("splits", {})
    if not isinstance(splits, dict) or not all(isinstance(s, str) and is_count(n) for s, n in splits.items()):
        return f"it records splits={splits!r}, a map of split -> rows expected"
    return records_problem(rec.get("files"))


def meta_problem(meta: dict) -> str | None:
    """Why meta.json's record of the shards and the plan has another shape than the one
    collect writes (`record_problem` for each shard), or None."""
    shards, plan, missing = meta["shards"], meta.get("plan", []), meta.get("missing", [])
    if not isinstance(shards, dict):
        return f"its shards are {type(shards).__name__}, a map of shard name -> record expected"
    for name, rec in shards.items():
        problem = record_problem(rec) if name.startswith("shard-") and name[6:11].isdigit() \
            else "no shard's name"
        if problem:
            return f"its record of shard {name!r}: {problem}"
    if not isinstance(plan, list) or not all(  # a bank's parts hold a split's prompts
            isinstance(p, dict) and is_count(p.get("index")) and is_count(p.get("prompts", 0))
            and isinstance(p.get("split", ""), str) for p in plan):
        return "its plan is not a list of parts, each with its index"
    if not isinstance(missing, list) or not all(is_count(i) for i in missing):
        return "its missing shards are not a list of indices"
    return None


def read_record(shard: Path) -> dict | None:
    """A shard's own record (`shard.json`); None when missing, unreadable or malformed."""
    try:
        rec = json.loads((shard / MANIFEST).read_text())
    except (OSError, ValueError):
        rec = None
    return None if record_problem(rec) else rec
