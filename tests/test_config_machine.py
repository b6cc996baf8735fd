"""What the model and this machine allow, checked at validate or at load: symbolic tap
layers resolved on the model, the dtype for the device, a device the machine has, prompts
and max_new_tokens within the model's positions, sizes within its memory, flash attention
where its package and CUDA are."""
import pytest

from conftest import compose
from stopexp.config import ConfigError, validate
from stopexp.stages import build


@pytest.mark.parametrize("entries, n_layers, resolved", [
    (["mid"], 3, [1]), (["mid"], 30, [15]), (["mid"], 32, [16]), (["last"], 30, [29]),
    (["first", "last"], 28, [0, 27]), ([-1, 0], 3, [0, 2]), ([0, 1, -1], 3, [0, 1, 2]),
    (["last", -1, 2], 3, [2]),
])
def test_symbolic_tap_layers_resolve_against_the_model(entries, n_layers, resolved):
    from stopexp.core.protocol import resolve_layers

    assert resolve_layers(entries, n_layers) == resolved


def test_mid_tap_resolves_on_the_loaded_model(tiny_lm):
    from stopexp.search.taps import Taps

    model, _ = tiny_lm  # 2 layers
    with Taps(model, ["mid"]) as taps:
        assert taps.layers == [1]
    with Taps(model, [-1, 0]) as taps:  # shallowest first: read()[:, -1] is the deepest
        assert taps.layers == [0, 1]
    with pytest.raises(ValueError, match="^tap.layers: layer 5 is outside the model's 2 layers"):
        Taps(model, [5])


def test_auto_dtype_suits_the_device():
    import torch

    from stopexp.models import pick_dtype

    assert pick_dtype("auto", torch.device("cpu")) == torch.float32
    assert pick_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    assert compose("collect", ["model=qwen"]).model.dtype == "auto"
    assert compose("collect").model.dtype == "float32"  # the toy LM states it


@pytest.mark.parametrize("device,cuda,mps,msg", [
    ("cuda", 0, False, "'cuda': this machine has no CUDA device (torch sees none); use "
                       "model.device=auto or cpu"),
    ("cuda:0", 0, False, "'cuda:0': this machine has no CUDA device"),
    ("cuda:7", 2, False, "'cuda:7': this machine has 2 CUDA devices (cuda:0..cuda:1)"),
    ("cuda:1", 1, False, "'cuda:1': this machine has 1 CUDA device (cuda:0..cuda:0)"),
    ("mps", 0, False, "'mps': this machine has no MPS device (Apple silicon)"),
    ("cdua", 0, False, "'cdua' is not a device; allowed: auto, cpu, mps, cuda, cuda:N"),
    ("cuda:", 1, False, "'cuda:' is not a device"),
])
def test_a_device_this_machine_lacks_fails_at_validate(monkeypatch, device, cuda, mps, msg):
    from stopexp.config import machine
    monkeypatch.setattr(machine, "cuda_devices", lambda: cuda)
    monkeypatch.setattr(machine, "mps_available", lambda: mps)
    with pytest.raises(ConfigError, match="^model.device: ") as e:
        validate(compose("collect", [f"model.device={device}"]))
    assert msg in str(e.value)


def test_a_device_this_machine_has_passes(monkeypatch):
    from stopexp.config import machine
    monkeypatch.setattr(machine, "cuda_devices", lambda: 2)
    monkeypatch.setattr(machine, "mps_available", lambda: True)
    for device in ("auto", "cpu", "cuda", "cuda:1", "mps"):
        validate(compose("collect", [f"model.device={device}"]))


def _problems(*prompts):
    from types import SimpleNamespace

    return [SimpleNamespace(prompt=p, split="test", prompt_id=i, source_row=10 + i)
            for i, p in enumerate(prompts)]


def test_prompts_longer_than_the_model_allows_are_refused_or_skipped(tiny_lm, caplog):
    from stopexp.search.sample import PromptTooLong, fit_prompts, prompt_limit

    model, tok = tiny_lm  # 128 positions; the char tokenizer adds <s>
    cfg = compose("collect", ["search.max_new_tokens=20"])
    assert prompt_limit(cfg.model, cfg.search, cfg.get("engine"), model) == 128 - 20
    cfg.model.max_prompt_tokens = 6
    assert prompt_limit(cfg.model, cfg.search, cfg.get("engine"), model) == 6
    problems = _problems("1+2?", "1" * 10**6, "1+2*3-4?", "9?")
    with pytest.raises(PromptTooLong) as e:
        fit_prompts(tok, problems, 108)
    assert str(e.value) == (
        "model.max_prompt_tokens: prompt test/1, source row 11 is 1000001 tokens, longer than "
        "the 108 allowed (the model's positions minus search.max_new_tokens, or "
        "model.max_prompt_tokens); 1 of 4 prompts are too long. Shorten them, or set "
        "model.long_prompts=skip to leave them out")
    with caplog.at_level("WARNING"):
        kept = fit_prompts(tok, problems, 6, "skip")
    assert [p.prompt_id for p in kept] == [0, 3]
    assert "left out 2 of 4 prompts longer than 6 tokens (test/1: 1000001, test/2: 9)" in caplog.text
    assert fit_prompts(tok, problems, None) == problems


def test_collect_refuses_a_long_prompt_before_generating(tmp_path):
    from stopexp.search.sample import PromptTooLong
    from stopexp.store import bank
    from stopexp.stages.collect import collect

    cfg = compose("collect", [f"paths.output_dir={tmp_path}", "logger=none",
                              "search.n_paths=2", "collect.prompts.train=2",
                              "collect.prompts.val=0", "collect.prompts.test=0",
                              "model.max_prompt_tokens=5"])
    # the toy LM's arith prompts are known at validate (a BOS and one token per character)
    with pytest.raises(ConfigError, match=r"^model.max_prompt_tokens: 5: prompt train/1 of task "
                                          r"arith is 15 tokens of the toy LM"):
        validate(cfg)
    # a model whose prompts validate cannot count: the bank refuses them before generating
    with pytest.raises(PromptTooLong, match=r"^model.max_prompt_tokens: prompt train/0 is \d+ "
                                            r"tokens, longer than the 5 allowed"):
        collect(build.collection(cfg))
    assert not bank.finished_shards(build.bank(cfg).root)


def test_max_new_tokens_beyond_the_models_positions_fails_before_it_loads(tmp_path):
    # the toy LM has 256 positions; SmolLM2 8192 (its GGUF header); a local directory's
    # config.json (no weights needed)
    with pytest.raises(ConfigError, match=r"^search.max_new_tokens: 256 leaves no room for a "
                                          r"prompt in the 256 positions of model 'toy' \(model.toy\); "
                                          r"allowed: < 256$"):
        validate(compose("collect", ["search.max_new_tokens=256"]))
    # the arith prompts of 6 steps are 15 tokens of the toy LM: 256 - 15 = 241 new tokens fit
    validate(compose("collect", ["search.max_new_tokens=241"]))
    with pytest.raises(ConfigError, match=r"^search.max_new_tokens: 242: prompt val/49 of task "
                                          r"arith is 15 tokens of the toy LM \(a BOS and one per "
                                          r"character\), and the toy LM's 256 positions leave it 14; "):
        validate(compose("collect", ["search.max_new_tokens=242"]))
    smol = ["model=smollm2", "task=wordprob", "model.chat_template=false"]
    with pytest.raises(ConfigError, match=r"^search.max_new_tokens: 100000 leaves no room for a "
                                          r"prompt in the 8192 positions of model 'smollm2-135m-instruct' \(.*"
                                          r"SmolLM2-135M-Instruct.Q4_1.gguf\); allowed: < 8192$"):
        validate(compose("collect", [*smol, "search.max_new_tokens=100000"]))
    # with model.max_prompt_tokens set, the user chose the prompt's room
    validate(compose("collect", [*smol, "search.max_new_tokens=100000", "model.max_prompt_tokens=64"]))
    (tmp_path / "config.json").write_text(
        '{"max_position_embeddings": 512, "num_hidden_layers": 2, "num_attention_heads": 4, '
        '"hidden_size": 32}')
    local = ["model=llama", f"model.path={tmp_path}", "model.num_layers=2"]
    with pytest.raises(ConfigError, match=f"^search.max_new_tokens: 512 leaves no room for a "
                                          f"prompt in the 512 positions of model '.*' "
                                          f"\\({tmp_path}/config.json\\); allowed: < 512$"):
        validate(compose("collect", [*local, "search.max_new_tokens=512"]))
    validate(compose("collect", [*local, "search.max_new_tokens=511"]))


def test_extreme_sizes_fail_naming_the_key(monkeypatch):
    from stopexp.config import machine
    monkeypatch.setattr(machine, "memory_gib", lambda: 16.0)
    # 3 x (4 x 1e6^2 + 3 x 1e6 x 288) = 1.2e13 parameters, 16 bytes each in training
    with pytest.raises(ConfigError, match=r"^model.toy: 3 layers of hidden_size 1000000 and "
                                          r"intermediate_size 288 are 1.2e\+13 parameters: training "
                                          r"them takes 1.79e\+05 GiB or more, and this machine has "
                                          r"16.0 GiB$"):
        validate(compose("collect", ["model.toy.hidden_size=1000000"]))
    # a negative N derives policy.keep from N = 1 so that N itself is named (not a math
    # domain error in resolving policy.keep)
    with pytest.raises(ConfigError, match=r"^search.n_paths: N must be >= 1, got -1$"):
        validate(compose("evaluate", ["search.n_paths=-1"]))
    with pytest.raises(ConfigError, match=r"^task.n_steps: must lie in 1..1000, got 1000000000$"):
        validate(compose("collect", ["task.n_steps=1000000000"]))


def test_flash_attention_without_its_package_fails_at_validate(monkeypatch):
    import importlib.util

    from stopexp.config import machine
    smol = ["model=smollm2", "task=wordprob", "model.chat_template=false"]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^model.attn_implementation: 'flash_attention_2' needs "
                                          r"the package flash_attn, which is not installed; use sdpa "
                                          r"or eager$"):
        validate(compose("collect", [*smol, "model.attn_implementation=flash_attention_2"]))
    validate(compose("collect", [*smol, "model.attn_implementation=sdpa"]))
    monkeypatch.setattr(machine, "cuda_devices", lambda: 0)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^model.attn_implementation: 'flash_attention_2' runs on "
                                          r"CUDA only, and this machine has no CUDA device"):
        validate(compose("collect", [*smol, "model.attn_implementation=flash_attention_2"]))
