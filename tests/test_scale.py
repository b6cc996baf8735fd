import os
import shutil
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import FP32_REORDER, ROOT, compose
from stopexp.config import ConfigError, validate
from stopexp.search.sample import prompt_ids, row_cap
from stopexp.store import bank
from stopexp.stages.collect import collect
from stopexp.stages import build

SHARDED = ["logger=none", "search.n_paths=4", "collect.prompts.train=4", "collect.prompts.val=2",
           "collect.prompts.test=4", "collect.shard_prompts=1", "collect.mc_rollouts=0"]
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}={% endif %}")
GSM8K = ROOT / "tests" / "data" / "gsm8k_sample.jsonl"


@pytest.fixture
def chat_lm_dir(tiny_lm, tmp_path):
    """The tiny Llama saved as a local model whose tokenizer has a chat template."""
    model, tok = tiny_lm
    model.save_pretrained(tmp_path / "lm")
    tok.chat_template = TEMPLATE
    try:
        tok.save_pretrained(tmp_path / "lm")
    finally:
        tok.chat_template = None  # the fixture's tokenizer is shared by the session
    return tmp_path / "lm"


def local_model(path):
    return ["model=llama", f"model.path={path}", "model.hidden_size=32", "model.num_layers=2",
            "model.dtype=float32", "model.device=cpu", "model.attn_implementation=null"]


def sharded_cfg(out, *extra):
    return validate(compose("collect", [f"paths.output_dir={out}", *SHARDED, *extra]))


def assert_same_bank(a, b):
    da, db = bank.load_bank(build.bank(a).root), bank.load_bank(build.bank(b).root)
    for col in ("split", "prompt_id", "path_id", "text", "correct", "length"):
        assert list(da[col][:]) == list(db[col][:]), col
    assert list(map(list, da["tokens"][:])) == list(map(list, db["tokens"][:]))
    assert np.allclose(np.concatenate(da["token_logprob"][:]), np.concatenate(db["token_logprob"][:]), **FP32_REORDER)


@pytest.mark.parametrize("model", ["llama", "qwen"])
def test_real_model_configs_compose_and_validate(model):
    for stage in ("collect", "evaluate", "pipeline"):
        cfg = validate(compose(stage, [f"model={model}", "task=gsm8k"]))
        assert cfg.model.dtype == "auto" and cfg.model.device == "auto"
        assert cfg.model.attn_implementation == "sdpa" and cfg.model.chat_template
        assert cfg.model.max_batch_tokens >= cfg.search.n_paths * (cfg.search.max_new_tokens + 1)
    with pytest.raises(ConfigError, match="model.max_batch_tokens: 1000 cannot hold"):
        validate(compose("collect", [f"model={model}", "model.max_batch_tokens=1000"]))


def test_token_budget_lowers_the_rows_per_forward(tiny_lm):
    _, tok = tiny_lm
    cfg = compose("collect", ["search.max_batch_rows=64", "search.max_new_tokens=20"])
    problems = [SimpleNamespace(prompt="1+2?"), SimpleNamespace(prompt="1+2*3-4?")]
    assert row_cap(cfg.search, cfg.model, tok, problems) == 64  # no budget: the row cap alone
    cfg.model.max_batch_tokens = 300  # longest prompt: <s> + 8 chars = 9 tokens
    assert row_cap(cfg.search, cfg.model, tok, problems) == 300 // (9 + 20)
    cfg.model.max_batch_tokens = 10**6  # the smaller of the two wins
    assert row_cap(cfg.search, cfg.model, tok, problems) == 64


def test_chat_template_renders_prompts_and_the_toy_keeps_plain_ones(tiny_lm, chat_lm_dir):

    _, tok = tiny_lm
    assert prompt_ids(tok, "4+7?") == tok("4+7?")["input_ids"]  # no template: plain
    _, local = build.lm(compose("collect", local_model(chat_lm_dir)))
    assert local.chat_template == TEMPLATE
    assert prompt_ids(local, "4+7?") == tok("4+7?=")["input_ids"]  # one BOS, then the turn
    _, plain = build.lm(compose("collect", [*local_model(chat_lm_dir), "model.chat_template=false"]))
    assert prompt_ids(plain, "4+7?") == tok("4+7?")["input_ids"]


def test_qa_task_collects_with_a_local_chat_model(chat_lm_dir, out_dir):
    cfg = validate(compose("collect", [
        *local_model(chat_lm_dir), "task=gsm8k", f"task.path={GSM8K}",
        "task.split_fractions={train: 0.5, val: 0.25, test: 0.25}",
        "logger=none", "search.n_paths=2", "search.max_new_tokens=8", "tap.checkpoints=[2,4]",
        "search.check_at=2", "train.checkpoint=2", "collect.prompts.train=2", "collect.prompts.val=1",
        "collect.prompts.test=1", "collect.mc_rollouts=0", f"paths.output_dir={out_dir}",
        "model.max_prompt_tokens=1024"]))  # char-level questions outrun the tiny model's 128 positions
    assert collect(build.collection(cfg))["paths"] == 8
    root = build.bank(cfg).root
    meta = bank.read_meta(root)
    assert meta["complete"] and sorted(r for s in meta["split_rows"].values() for r in s) == list(range(16))
    assert meta["task"]["seed"] == 0 and meta["task"]["path"] == str(GSM8K)
    ds = bank.load_bank(root)
    assert set(ds["style"][:]) == {"n/a"} and ds["prompt"][0].endswith("#### <number>")


def test_toy_lm_refuses_other_tasks(out_dir):

    cfg = compose("collect", ["task=gsm8k", f"task.path={GSM8K}", f"paths.output_dir={out_dir}"])
    with pytest.raises(ConfigError, match="task.name: the toy LM learns only task=arith"):
        build.lm(cfg)


def test_array_jobs_shard_like_one_process_and_the_last_one_completes(out_dir, tmp_path):
    single = sharded_cfg(tmp_path / "single")
    collect(build.collection(single))
    cfg = sharded_cfg(out_dir, "collect.rank=0", "collect.world=2")
    root = build.bank(cfg).root
    assert root.name == build.bank(single).root.name  # rank and world are not content
    assert not collect(build.collection(cfg), 0, 2)["complete"] and not bank.read_meta(root)["complete"]
    assert {bank.shard_index(n) % 2 for n in bank.finished_shards(root)} == {0}
    assert collect(build.collection(cfg), 1, 2)["complete"] and bank.read_meta(root)["complete"]
    assert {n[-4:] for n in bank.finished_shards(root)} == {"r000", "r001"}
    assert_same_bank(cfg, single)


def test_sharding_names_its_errors():
    with pytest.raises(ConfigError, match="collect.rank"):
        validate(compose("collect", ["collect.rank=2", "collect.world=2"]))
    with pytest.raises(ConfigError, match="collect.world"):
        validate(compose("collect", ["collect.world=0"]))


@pytest.mark.slow  # about 30 s: two fresh interpreters import torch, transformers, datasets
def test_torchrun_two_processes_equal_one_process_and_resume_per_shard(out_dir, tmp_path):
    args = [f"paths.output_dir={out_dir}", *SHARDED]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1", "WANDB_MODE": "disabled"}
    cmd = [str(ROOT / ".venv" / "bin" / "torchrun"), "--standalone", "--nproc_per_node=2",
           "-m", "stopexp.collect", *args]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
    cfg, single = sharded_cfg(out_dir), sharded_cfg(tmp_path / "single")
    collect(build.collection(single))
    root = build.bank(cfg).root
    assert bank.read_meta(root)["complete"]
    assert {n[-4:] for n in bank.finished_shards(root)} == {"r000", "r001"}
    assert_same_bank(cfg, single)
    # a lost shard is redone alone, by whichever process runs next
    lost = sorted(bank.finished_shards(root))[3]
    mtimes = {n: (root / n).stat().st_mtime for n in bank.finished_shards(root) if n != lost}
    shutil.rmtree(root / lost)
    collect(build.collection(cfg))
    assert {n: (root / n).stat().st_mtime for n in mtimes} == mtimes
    assert_same_bank(cfg, single)
