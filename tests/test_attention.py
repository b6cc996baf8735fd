"""Attention entropy as a tap: the heads it reads, its value against a plain forward, the
same value at collect and online, and nothing changed when it is off."""
import copy
import logging

import numpy as np
import pytest
import torch

from conftest import FP32_REORDER, compose
from stopexp.config import ConfigError, validate
from stopexp.core.protocol import attention_heads
from stopexp.search.taps import Taps
from stopexp.signals.feature_spec import SIGNAL_NAMES
from stopexp.stages import build

ATTN = SIGNAL_NAMES.index("attn_entropy")


@pytest.fixture(scope="module")
def eager_lm(tiny_lm):
    model, tok = tiny_lm
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    return eager, tok


def test_heads_are_parsed_and_checked():
    assert attention_heads(None, [-1], 2, 4) == []
    assert attention_heads("all", [0, -1], 2, 4) == [(l, h) for l in (0, 1) for h in range(4)]
    assert attention_heads("all", ["last"], 2, 4) == [(1, h) for h in range(4)]
    assert attention_heads(["0:1", "last:3", "-2:1"], [-1], 2, 4) == [(0, 1), (1, 3)]
    for bad, msg in (("some", "give all or a non-empty list"), ([], "give all"),
                     (["0-1"], "'0-1' is not layer:head"), ([61], "quote them in YAML"),
                     (["5:0"], "'5:0': layer 5 is outside the model's 2 layers"),
                     (["0:4"], "head 4 is outside the model's 4 heads")):
        with pytest.raises(ConfigError, match=f"tap.attention_heads: .*{msg}"):
            attention_heads(bad, [-1], 2, 4)


def _entropy_by_hand(model, ids: list[int], heads) -> float:
    out = model(torch.tensor([ids]), output_attentions=True)
    p = torch.stack([out.attentions[l][0, h, -1] for l, h in heads])
    return float(-(p * p.log()).sum(-1).mean())


def test_entropy_at_the_check_equals_a_plain_forward(eager_lm):
    from stopexp.search.decode import SamplingParams, make_engine

    model, tok = eager_lm
    prompts = [tok("4+7*3-9?")["input_ids"], tok("1-2?")["input_ids"]] * 3  # left padding: masked keys
    heads = ["0:1", "1:0", "1:3"]
    with Taps(model, [-1], attention_heads=heads) as taps:
        engine = make_engine(model, tok, SamplingParams(max_new_tokens=8), taps, (3,))
        state = engine.run(engine.launch(prompts, list(range(6))), until=3)
    tok_ids, *_ = state.tensors(tok.pad_token_id)
    rows, _ = state.features[3]
    got = state.attn[3]
    assert got.shape == (len(rows),) and 1 in rows.remainder(2).tolist()  # a padded row is live
    for r, p in enumerate(rows.tolist()):
        want = _entropy_by_hand(model, prompts[p] + tok_ids[p, :3].tolist(), [(0, 1), (1, 0), (1, 3)])
        assert float(got[r]) == pytest.approx(want, abs=FP32_REORDER["atol"])
    assert 0 < float(got.min()) and float(got.max()) < np.log(len(prompts[0]) + 3)


def test_attention_needs_eager(tiny_lm):
    from stopexp.search.decode import SamplingParams, make_engine

    model, tok = tiny_lm  # sdpa: the attention returns no weights
    with Taps(model, [-1], attention_heads="all") as taps:
        engine = make_engine(model, tok, SamplingParams(max_new_tokens=4), taps, (2,))
        with pytest.raises(RuntimeError, match="needs eager attention"):
            engine.launch([tok("1-2?")["input_ids"]], [0])


def test_features_and_online_see_the_same_entropy_and_off_changes_nothing(eager_lm):
    from stopexp.core.policies import TopK
    from stopexp.models.extract import extract
    from stopexp.search.decode import SamplingParams, make_engine
    from stopexp.search.decode_steps import DecodeSteps
    from stopexp.search.lcr import launch_check_resume
    from stopexp.search.sample import prompt_ids
    from stopexp.search.trace import trace_problems
    from stopexp.tasks import ArithTask

    model, tok = eager_lm
    task = ArithTask(n_steps=2)
    problems = task.problems("test", 2)
    params, c = SamplingParams(max_new_tokens=10), 3
    cols, _ = trace_problems(make_engine(model, tok, params).steps(32), tok, task, problems, 4, 0, [], 0)

    def online(heads):
        with Taps(model, [-1], attention_heads=heads) as taps:
            engine = make_engine(model, tok, params, taps, (c,))
            _, batch = launch_check_resume(DecodeSteps(engine), tok, task, problems, 4, 0, c,
                                           {"a": (lambda b: -b["signals"][:, ATTN], lambda: TopK(2))}, 4)
        return batch

    batch = online("all")
    keys = [(i, j) for i in range(2) for j in range(4)]
    alive = np.asarray(cols["length"]) > c
    seqs = [(prompt_ids(tok, problems[i].prompt), cols["tokens"][k], [c] if alive[k] else [])
            for k, (i, _) in enumerate(keys)]
    with Taps(model, [-1], attention_heads="all", sequence=True) as taps:
        got = extract(model, taps, seqs, tok.pad_token_id)
    assert alive.any() and sorted(batch["row"]) == [k for k, a in zip(keys, alive) if a]
    for k, r in batch["row"].items():
        entropy = got[keys.index(k)][1][0]
        assert entropy > 0 and entropy == pytest.approx(float(batch["signals"][r, ATTN]), abs=FP32_REORDER["atol"])
    off = online(None)
    assert (off["signals"][:, ATTN] == 0).all()
    others = [i for i in range(len(SIGNAL_NAMES)) if i != ATTN]
    assert torch.allclose(off["signals"][:, others], batch["signals"][:, others], **FP32_REORDER)


def test_config_asks_for_the_tap_and_loads_eager(tmp_path, caplog):

    base = ["logger=none", f"paths.output_dir={tmp_path}"]
    with pytest.raises(ConfigError, match="evaluate.methods: attn_entropy needs the attention tap"):
        validate(compose("evaluate", [*base, "evaluate.methods=[attn_entropy]"]))
    with pytest.raises(ConfigError, match="predictor.signals: attn_entropy needs the attention tap"):
        validate(compose("train", [*base, "predictor=conf_features", "predictor.signals=[attn_entropy]"]))
    with pytest.raises(ConfigError, match=r"predictor.signals: .* is read only by predictor=conf_features"):
        validate(compose("train", [*base, "predictor=mlp", "predictor.signals=[hidden_var]"]))
    with pytest.raises(ConfigError, match="tap.attention_heads: '0:9': head 9 is outside"):
        validate(compose("collect", [*base, "tap.attention_heads=[0:9]"]))
    on = validate(compose("evaluate", [*base, "tap.attention_heads=[0:1,last:2]",
                                       "evaluate.methods=[attn_entropy]"]))
    off = validate(compose("evaluate", base))
    assert build.bank(on).key == build.bank(off).key and build.feature_set(on).key != build.feature_set(off).key  # a tap, not generation
    with caplog.at_level(logging.INFO, logger="stopexp.models"):
        model, _ = build.lm(on, progress=False)
    assert model.config._attn_implementation == "eager"
    assert "loading with eager attention" in caplog.text
    assert build.lm(off, progress=False)[0].config._attn_implementation != "eager"
