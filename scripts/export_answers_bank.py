"""Write a collected trace bank's split as an answers-only bank (the public JSON shape of
`stopexp.stopping.answers_bank`), reading an intermediate answer every PROBE_FREQ tokens of each
path from its decoded prefix, so that the answer-consensus methods (Parallel-Probe among
them) can be replayed on it with `python -m stopexp.answers_replay`.

    python scripts/export_answers_bank.py OUT.json --probe-freq 4 -- +exp=toy_contrastive [overrides]

The intermediate answer of a prefix is its final answer when it has one (the task's
`answer_of`), else the last match of --probe-pattern (default: the last running value
written as "=<number>", as in the arithmetic task); "" when neither is there.
"""
from __future__ import annotations

import argparse
import json
import re
import sys


from stopexp.store import bank
from stopexp.stages import build
from stopexp.runtime.overrides import stage_config


def probe_answers(tokens, tokenizer, task, probe_freq: int, pattern: re.Pattern) -> list[str]:
    """The answers read after probe_freq, 2 * probe_freq, ... tokens (before the path ends)."""
    out = []
    for end in range(probe_freq, len(tokens), probe_freq):
        text = tokenizer.decode(list(tokens[:end]), skip_special_tokens=True)
        found = task.answer_of(text) or next(iter(pattern.findall(text)[::-1]), "")
        out.append(found)
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--probe-freq", type=int, default=4)
    ap.add_argument("--probe-pattern", default=r"=(-?\d+)")
    ap.add_argument("--split", default="test")
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    args.overrides = argv[cut + 1:]
    if args.probe_freq < 1:
        ap.error(f"--probe-freq must be >= 1, got {args.probe_freq}")
    from transformers import AutoTokenizer

    from stopexp.models import model_dir
    from stopexp.tasks import build_task

    cfg = stage_config("collect", args.overrides)
    root = bank.require_bank(build.bank(cfg))
    ds = bank.load_bank(root, args.split)
    tokenizer = AutoTokenizer.from_pretrained(model_dir(cfg.model, cfg.paths.cache_dir, cfg.task, progress=False))
    task = build_task(cfg.task)
    ids = ds["prompt_id"][:]
    problems = task.problems(args.split, int(ids.max()) + 1)
    pattern = re.compile(args.probe_pattern)
    prompts: dict = {}
    for pid, tokens, length, answer in zip(ids, ds["tokens"][:], ds["length"][:], ds["answer"][:]):
        p = problems[int(pid)]
        item = prompts.setdefault(int(pid), {
            "question": p.prompt, "gold_answer": task.answer_of(task.reference(p)),
            "probe_freq": args.probe_freq, "each_branch": []})
        item["each_branch"].append([probe_answers(tokens, tokenizer, task, args.probe_freq, pattern),
                                    int(length), str(answer)])
    with open(args.out, "w") as f:
        json.dump([prompts[k] for k in sorted(prompts)], f)
    print(f"wrote {len(prompts)} prompts x {len(ds) // max(1, len(prompts))} branches of bank "
          f"{root.name} ({args.split}) to {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
