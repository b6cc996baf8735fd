"""Regenerate tests/data/config_sections.json: config_hash(plain(cfg.<section>)) of each
pinned composition (tests/test_config_schemas.py), printing every section whose hash moved.

A moved section moves the keys of the artifacts that hash it (store/keys.py), unless the
key leaves the new value out at its default: say which in the commit that re-pins.

    python scripts/pin_config_sections.py            # rewrite the file, list what moved
    python scripts/pin_config_sections.py --check    # exit 1 if anything would move
    python scripts/pin_config_sections.py --add "pipeline +exp=NAME"   # pin one more
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import stopexp.config  # noqa: F401 (registers the schemas the yaml files extend)
from stopexp.runtime.artifacts import config_hash, plain

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "tests" / "data" / "config_sections.json"
# what a new composition pins (an existing one keeps its own list): what artifact keys hash
SECTIONS = ("adapt", "collect", "engine", "evaluate", "loss", "model", "policy", "predictor",
            "reward", "search", "tap", "task", "train")


def hashes(case: str, sections) -> dict[str, str]:
    """The `sections` of one composition: `stage [override ...]`."""
    stage, *overrides = case.split(" ")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name=stage, overrides=overrides)
    return {s: config_hash(plain(cfg[s])) for s in sections}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a pin would move")
    ap.add_argument("--add", action="append", default=[], help="a composition to pin too")
    args = ap.parse_args()
    old = json.loads(PINS.read_text())
    new = {case: hashes(case, old.get(case, SECTIONS)) for case in sorted({*old, *args.add})}
    moved = [(case, s, old.get(case, {}).get(s), h) for case in new for s, h in new[case].items()
             if old.get(case, {}).get(s) != h]
    for case, section, before, after in moved:
        print(f"{case}: {section} {before or '(new)'} -> {after}")
    print(f"{len(moved)} pinned hashes moved of {sum(map(len, new.values()))}")
    if args.check:
        return 1 if moved else 0
    PINS.write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
