import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import FP32_REORDER, compose
from stopexp.models import ModelNotAvailable
from stopexp.stages import build
from stopexp.models.tokenizer import CHARS, build_char_tokenizer
from stopexp.models.toy_lm import train_toy_lm
from stopexp.tasks import ArithTask


def test_char_tokenizer_round_trip_and_reload(tmp_path):
    tok = build_char_tokenizer()
    text = "4+7*3-9?4+7=1;1*3=3;3-9=4;#4"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == len(text) + 1
    assert tok.decode(ids, skip_special_tokens=True) == text
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(text)["input_ids"] == ids
    assert again.decode(ids, skip_special_tokens=True) == text
    assert len(set(tok.convert_tokens_to_ids(list(CHARS)))) == len(CHARS)
    assert tok.unk_token_id not in tok(CHARS)["input_ids"]


def test_toy_lm_trains_saves_and_reloads_with_identical_logits(tmp_path):
    cfg = compose("toy_lm", ["model.toy.hidden_size=32", "model.toy.num_layers=2",
                             "model.toy.intermediate_size=64", "model.toy.max_steps=3",
                             "model.toy.batch_size=8", "model.toy.eval_every=3",
                             "model.toy.screen_prompts=4", "model.toy.screen_paths=2"])
    info = train_toy_lm(cfg.model.toy, ArithTask(n_steps=6), tmp_path)
    assert info["steps"] == 3 and len(info["history"]) == 1
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = tok(["4+7*3-9?4+7="], return_tensors="pt")["input_ids"]
    first = again(ids).logits
    second = AutoModelForCausalLM.from_pretrained(tmp_path).eval()(ids).logits
    assert torch.equal(first, second)
    # training is deterministic for a seed
    other = tmp_path / "again"
    train_toy_lm(cfg.model.toy, ArithTask(n_steps=6), other)
    assert torch.equal(AutoModelForCausalLM.from_pretrained(other).eval()(ids).logits, first)


def test_hub_model_offline_fails_with_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose("collect", ["+exp=llama_contrastive", "model.path=nobody/not-a-model",
                              f"paths.output_dir={tmp_path}"])
    with pytest.raises(ModelNotAvailable, match="model.path") as e:
        build.lm(cfg)
    assert "local copy" in str(e.value)


def test_local_path_that_is_not_a_model_is_a_clear_error(tmp_path):
    cfg = compose("collect", ["+exp=llama_contrastive", f"model.path={tmp_path}"])
    with pytest.raises(ModelNotAvailable, match="from that directory"):
        build.lm(cfg)


def test_device_map_loads_through_accelerate_and_featurizes_as_one_device(monkeypatch):
    """model.device_map reaches from_pretrained (accelerate places the weights, on this
    machine all on the CPU) and the teacher-forced features equal those of the model
    loaded on one device; a placement accelerate does not have is refused before loading."""
    from stopexp.config import ConfigError, validate
    from stopexp.models.extract import extract
    from stopexp.search.taps import Taps

    seen = []
    original = AutoModelForCausalLM.from_pretrained.__func__

    def recording(cls, *args, **kwargs):
        seen.append(kwargs.get("device_map"))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(recording))
    features = []
    for placement in ([], ["model.device_map=auto"]):
        lm, tok = build.lm(validate(compose("featurize", ["model.device=cpu", *placement])))
        ids = tok("1+2=3")["input_ids"]
        with Taps(lm, [0, 1], "last", sequence=True) as taps:
            (states, _), = extract(lm, taps, [(ids, ids[:3], [1, 2, 3])], tok.pad_token_id)
        features.append(states)
    assert seen == [None, "auto"]
    np.testing.assert_allclose(features[1], features[0], **FP32_REORDER)
    with pytest.raises(ConfigError, match="model.device_map: 'everywhere' is not a placement; "
                                          "allowed: null, auto, balanced, balanced_low_0, sequential"):
        validate(compose("featurize", ["model.device_map=everywhere"]))
