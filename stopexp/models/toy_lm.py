"""The embedded model: a tiny Llama trained locally on the embedded task.

Training stops early, by design: a fully trained tiny model solves the task almost always
and leaves nothing to prune. The stopping point is the first evaluation at which the
per-path accuracy on separate screening prompts (val split, sampled at the search
temperature) reaches `target_accuracy`.
"""
from __future__ import annotations

import json
import logging
import random
import shutil
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from safetensors import safe_open
from transformers import LlamaConfig, LlamaForCausalLM

from stopexp.config.machine import TOY_POSITIONS
from stopexp.config.task import task_sections
from stopexp.core.errors import ConfigError, NotMade, writing
from stopexp.core.names import lookup, names
from stopexp.models.tokenizer import CHARS, build_char_tokenizer
from stopexp.runtime.artifacts import artifact_lock, config_hash, publish_dir, staging_dir, write_json
from stopexp.runtime.integrity import dir_problem, records, set_aside
from stopexp.search.decode import SamplingParams, make_engine
from stopexp.search.sample import sample_paths
from stopexp.tasks import build_task
from stopexp.tasks.arith import ArithTask

log = logging.getLogger(__name__)
COMMITTED = Path(__file__).parent / "pretrained"
INFO = "toy_lm.json"
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", INFO)


ARITH_KEYS = ArithTask.toy_keys  # what model.toy.train_task pins (stopexp.stages.shift)


def toy_key(toy_cfg, task_cfg) -> str:
    """What determines the toy LM: its own settings (screening sampler included) and the
    task's keys it learns from (its class's `toy_keys`); fields of other tasks stay out, so
    the arith LM keeps the committed checkpoint."""
    components = task_sections(task_cfg) if task_cfg.name == "mixture" else []
    for key, t in [("task", task_cfg), *components]:
        if not lookup("task", t.name).toy_keys:
            learnable = [n for n in names("task") if lookup("task", n).toy_keys]
            raise ConfigError(f"{key}.name: the toy LM learns only task={' or '.join(learnable)}, "
                              f"not {t.name!r}; use a real model (model=smollm2, model=llama or "
                              "model.path=DIR)")
    toy = OmegaConf.to_container(toy_cfg, resolve=True)
    toy.pop("train_task", None)  # folded into the task below: a pinned LM keeps its key
    return config_hash(toy, lm_task(toy_cfg, task_cfg))


def lm_task(toy_cfg, task_cfg) -> dict:
    """The arith task settings the toy LM learns: the studied task's, with
    `model.toy.train_task` in place where set (a distribution shift: the LM learned one
    task, the prompts come from another)."""
    task = OmegaConf.to_container(task_cfg, resolve=True)
    pinned = toy_cfg.get("train_task") if hasattr(toy_cfg, "get") else None
    if OmegaConf.is_config(pinned):
        pinned = OmegaConf.to_container(pinned, resolve=True)
    return {k: task[k] for k in lookup("task", task["name"]).toy_keys} | dict(pinned or {})


def screening_params(toy_cfg) -> SamplingParams:
    return SamplingParams(max_new_tokens=toy_cfg.screen_max_new_tokens,
                          temperature=toy_cfg.screen_temperature)


def build_model(toy_cfg, tokenizer) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=toy_cfg.hidden_size,
        num_hidden_layers=toy_cfg.num_layers, num_attention_heads=toy_cfg.num_heads,
        num_key_value_heads=toy_cfg.num_heads, intermediate_size=toy_cfg.intermediate_size,
        max_position_embeddings=TOY_POSITIONS, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(toy_cfg.seed)
    return LlamaForCausalLM(config)


def _batch(task, tokenizer, rng: random.Random, size: int):
    seqs, prompt_lens = [], []
    for _ in range(size):
        p = task.sample("train", rng)
        prompt = tokenizer(p.prompt)["input_ids"]
        answer = tokenizer(task.training_text(p, rng), add_special_tokens=False)["input_ids"]
        seqs.append(prompt + answer + [tokenizer.eos_token_id])
        prompt_lens.append(len(prompt))
    width = max(map(len, seqs))
    ids = torch.full((size, width), tokenizer.pad_token_id)
    labels = torch.full((size, width), -100)
    for i, (s, n) in enumerate(zip(seqs, prompt_lens)):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, n : len(s)] = torch.tensor(s[n:])  # loss on the completion only
    return ids, (ids != tokenizer.pad_token_id).long(), labels


def screen(model, tokenizer, task, toy_cfg) -> float:
    """Per-path accuracy on the screening prompts (val split) at the search temperature."""
    model.eval()
    problems = task.problems("val", toy_cfg.screen_prompts)
    engine = make_engine(model, tokenizer, screening_params(toy_cfg))
    paths = sample_paths(engine, tokenizer, task, problems, toy_cfg.screen_paths,
                         seed=toy_cfg.seed + 1)
    model.train()
    return sum(p.correct for p in paths) / len(paths)


def train_toy_lm(toy_cfg, task, out_dir: Path, progress=True) -> dict:
    """Train until screening accuracy reaches the target; save with `save_pretrained`."""
    tokenizer = build_char_tokenizer(task.toy_chars or CHARS)  # the task's alphabet
    model = build_model(toy_cfg, tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=toy_cfg.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, toy_cfg.warmup_steps)))
    rng = random.Random(toy_cfg.seed)
    start, history, acc, step = time.time(), [], 0.0, 0
    model.train()
    for step in range(1, toy_cfg.max_steps + 1):
        ids, mask, labels = _batch(task, tokenizer, rng, toy_cfg.batch_size)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % toy_cfg.eval_every == 0 or step == toy_cfg.max_steps:
            acc = screen(model, tokenizer, task, toy_cfg)
            history.append({"step": step, "loss": loss.item(), "screen_accuracy": acc,
                            "seconds": round(time.time() - start, 1)})
            if progress:
                log.info("toy LM step %d  loss %.4f  screening per-path accuracy %.3f  (%.0fs)",
                         step, loss.item(), acc, time.time() - start)
            if acc >= toy_cfg.target_accuracy:
                break
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {"steps": step, "screen_accuracy": acc, "train_seconds": round(time.time() - start, 1),
            "parameters": sum(p.numel() for p in model.parameters()), "history": history,
            "reached_target": acc >= toy_cfg.target_accuracy,
            "files": records(out_dir, skip=(INFO,))}  # checked whenever it is loaded
    write_json(out_dir / INFO, info)
    return info


def toy_lm_problem(directory: Path) -> str | None:
    """Why a toy LM directory cannot be used (a file missing, truncated or garbled), or
    None. Checked against the sizes and SHA-256 in its toy_lm.json; a toy_lm.json without
    them: the files must be there and the weights' header must cover them."""
    try:
        info = json.loads((directory / INFO).read_text())
    except (OSError, ValueError) as e:
        return f"{INFO} is missing or unreadable ({e.__class__.__name__})"
    if "files" in info:
        return dir_problem(directory, info["files"])
    missing = [f for f in REQUIRED if not (directory / f).is_file()]
    if missing:
        return f"{', '.join(missing)} missing"
    try:
        safe_open(str(directory / "model.safetensors"), "pt").keys()
    except Exception as e:  # SafetensorError: "incomplete metadata, file not fully covered"
        return f"model.safetensors cannot be read ({str(e)[:120]})"
    return None


def find_toy_lm(toy, task, cache_dir) -> Path:
    """The directory of the toy LM of `toy` (model.toy) trained on `task` (the task
    section): under `cache_dir`, else the committed checkpoint; NotMade naming
    `python -m stopexp.toy_lm`, which trains it, when neither is there intact. Under the
    cached copy's lock, so that none is read while the toy_lm stage replaces it."""
    final = Path(cache_dir) / "toy_lm" / toy_key(toy, task)
    damaged = []
    with artifact_lock(final):
        for where in (final, COMMITTED / f"toy-{final.name}"):
            if where.exists():
                problem = toy_lm_problem(where)
                if problem is None:
                    return where
                damaged.append(f"{where} is damaged: {problem}")
    raise NotMade("toy LM (model.toy, trained on its task)", final, "toy_lm", "; ".join(damaged))


def ensure_toy_lm(toy, task, cache_dir, progress=True) -> Path:
    """The directory of the toy LM of `toy` (model.toy) trained on `task` (the task
    section): under `cache_dir`, else the committed checkpoint, else trained now (and
    cached). A damaged cached copy is deleted and trained again, a damaged committed one
    is passed over (both with a warning naming the file). Under the cached copy's lock
    (`artifact_lock`): concurrent callers train it once, and none reads it while
    `python -m stopexp.toy_lm` replaces it."""
    final = Path(cache_dir) / "toy_lm" / toy_key(toy, task)
    with artifact_lock(final):
        return _ensure(toy, task, final, progress)


def _ensure(toy, task, final: Path, progress: bool) -> Path:
    committed = COMMITTED / f"toy-{final.name}"
    if final.exists():
        problem = toy_lm_problem(final)
        if problem is None:
            return final
        log.warning("the cached toy LM %s is damaged (%s); deleting it and training it again",
                    final, problem)
        set_aside(final)
    if committed.exists():
        problem = toy_lm_problem(committed)
        if problem is None:
            return committed
        log.warning("the committed toy LM %s is damaged (%s; `git checkout -- %s` restores it); "
                    "training one into the cache instead", committed, problem, committed)
    log.info("training the toy LM (%s) into %s", final.name, final)
    tmp = staging_dir(final)
    try:
        with writing(final):  # a full disk names the model, not its temporary dir
            train_toy_lm(toy, build_task(OmegaConf.create(lm_task(toy, task))),
                         tmp, progress)
            publish_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
