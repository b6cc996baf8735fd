"""lm-evaluation-harness' view of the server against stopexp's evaluate, prompt by prompt:
the harness' logged samples (`lm_eval ... --log_samples`) of the task stopexp_gsm8k and the
`prompts.jsonl` of an evaluate run of the same exp, for the method the server served. Per
prompt: the same chosen text? the same graded outcome? Then both accuracies; every prompt
that differs is printed with both texts' starts, so a difference is explained path by path.

    python scripts/compare_lm_eval.py outputs/lm_eval/smollm2-135m-instruct/samples_stopexp_gsm8k_*.jsonl \\
        outputs/runs/evaluate/RUN/prompts.jsonl --method confidence

Exit status 1 when a prompt's text differs (so that a script can assert equality).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_jsonl(path: str, what: str) -> list[dict]:
    try:
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"error: {what} {path}: {e}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", help="lm-eval's samples_stopexp_gsm8k_*.jsonl (--log_samples)")
    parser.add_argument("prompts", help="prompts.jsonl of a python -m stopexp.evaluate run")
    parser.add_argument("--method", default="learned", help="the evaluated method the server served")
    args = parser.parse_args()
    samples = read_jsonl(args.samples, "samples")
    records = read_jsonl(args.prompts, "prompts")
    ours = {r["prompt_id"]: r for r in records if r["method"] == args.method}
    if not ours:
        methods = sorted({r["method"] for r in records})
        sys.exit(f"error: --method {args.method!r} is not in {args.prompts}; it has {', '.join(methods)}")
    missing = [s["doc_id"] for s in samples if s["doc_id"] not in ours]
    if missing:
        sys.exit(f"error: {args.prompts} lacks prompts {missing[:5]} of the harness' samples; "
                 f"evaluate at least {max(missing) + 1} test prompts (collect.prompts.test)")
    differ = []
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        text, mine = s["resps"][0][0], ours[s["doc_id"]]
        if text != mine["text"] or bool(s["acc"]) != mine["correct"]:
            differ.append((s["doc_id"], s["acc"], mine["correct"], text, mine["text"]))
    n = len(samples)
    harness = sum(s["acc"] for s in samples) / n
    evaluate = sum(ours[s["doc_id"]]["correct"] for s in samples) / n
    print(f"{n} prompts, method {args.method}: the same chosen text and outcome on {n - len(differ)}")
    print(f"accuracy: lm-eval acc {harness:.3f}, stopexp evaluate {evaluate:.3f} "
          f"(lm-eval strict_match {sum(s['strict_match'] for s in samples) / n:.3f})")
    for doc_id, acc, correct, text, mine in differ:
        print(f"prompt {doc_id}: lm-eval acc {acc:.0f} {text[:70]!r}\n"
              f"{'':>{len(str(doc_id)) + 8}}evaluate {correct:d} {mine[:70]!r}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
