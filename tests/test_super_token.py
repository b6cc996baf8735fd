import copy

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import FP32_REORDER, compose
from stopexp.config import ConfigError, LossConfig, PredictorConfig, validate
from stopexp.models.super_token import SuperTokenPredictor, load_super_token
from stopexp.search.decode import Engine, SamplingParams
from stopexp.signals.saved_predictor import CheckpointMismatch, save_predictor
from stopexp.signals.feature_spec import FeatureSpec
from stopexp.training.losses import build_loss
from stopexp.stages import build

PROMPTS = ["4+7*3-9?", "1-2?", "9*9*9+1-0-3*7?"]  # different lengths: left padding matters


@pytest.fixture(params=["full", "sliding"])
def any_lm(request, tiny_lm, sliding_lm):
    return tiny_lm if request.param == "full" else sliding_lm


def fresh(tiny_lm, seed=0, perturb=True):
    """A super token on a copy of the tiny LM; LoRA B is perturbed (peft starts it at 0,
    which would make every adapter check vacuous)."""
    lm, tok = copy.deepcopy(tiny_lm[0]), tiny_lm[1]
    torch.manual_seed(seed)
    st = SuperTokenPredictor(PredictorConfig(name="super_token"), lm, tok)
    if perturb:
        for name, p in st.lora.items():
            if "lora_B" in name:
                p.data.normal_(0, 0.2)
    return st.eval()


def launched(st, until=5):
    tok = st.tokenizer
    eng = Engine(st.lm, tok.eos_token_id, tok.pad_token_id, SamplingParams(max_new_tokens=12))
    state = eng.run(eng.launch([tok(p)["input_ids"] for p in PROMPTS], [3, 4, 5]), until=until)
    return eng, state


def replay_batch(state, pad_id):
    tokens, *_ = state.tensors(pad_id)
    rows = state.paths.tolist()
    return {"prompt": [PROMPTS[p] for p in rows], "tokens": [tokens[p] for p in rows],
            "prefix_len": torch.full((len(rows),), float(state.n_generated))}


def test_the_window_of_a_sliding_lm_is_in_effect(tiny_lm, sliding_lm):
    """The sliding-window LM's scores differ from its weights' without the window, and a
    check leaves its live cache (which holds only the window) as it was."""
    st, unwindowed = fresh(sliding_lm), fresh(tiny_lm)
    _, state = launched(st)
    layers = state.cache.layers
    assert all(layer.is_sliding and layer.cumulative_length > 6 for layer in layers)
    before = [(layer.keys.clone(), layer.cumulative_length, layer.record_past) for layer in layers]
    with torch.no_grad():
        online = st({"lm_state": state})
        batch = replay_batch(state, st.tokenizer.pad_token_id)
        assert not torch.allclose(online, unwindowed(batch), atol=1e-3)
    for (keys, length, record), layer in zip(before, layers):
        assert torch.equal(layer.keys, keys) and (layer.cumulative_length, layer.record_past) == (length, record)


def test_ordinary_tokens_see_no_adapter(tiny_lm):
    st = fresh(tiny_lm, perturb=False)
    ids = st.tokenizer(PROMPTS[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        plain = tiny_lm[0](ids).logits
        assert torch.equal(st.lm(ids).logits, plain)  # injected, switched off
        _, state = launched(st)
        batch = replay_batch(state, st.tokenizer.pad_token_id)
        zero_b = st(batch)
        for name, p in st.lora.items():
            if "lora_B" in name:
                p.data.normal_(0, 0.2)
        assert not torch.allclose(st(batch), zero_b)  # the adapter acts on [STOP] ...
        assert torch.equal(st.lm(ids).logits, plain)  # ... and on nothing else


def test_check_leaves_the_live_cache_and_the_paths_untouched(any_lm):
    st = fresh(any_lm)
    eng, state = launched(st)
    before = [(l.keys.clone(), l.values.clone()) for l in state.cache.layers]
    mask, pos = state.attention_mask.clone(), state.positions.clone()
    with torch.no_grad():
        st({"lm_state": state})
    for (k, v), layer in zip(before, state.cache.layers):
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
    assert torch.equal(state.attention_mask, mask) and torch.equal(state.positions, pos)
    checked = eng.run(state).tensors(st.tokenizer.pad_token_id)
    _, plain = launched(st)
    unchecked = eng.run(plain).tensors(st.tokenizer.pad_token_id)
    assert all(torch.equal(a, b) for a, b in zip(checked, unchecked))


def test_left_padded_rows_score_as_if_alone(any_lm):
    st = fresh(any_lm)
    _, state = launched(st)
    assert len({len(st.tokenizer(p)["input_ids"]) for p in PROMPTS}) == 3 and state.size == 3
    with torch.no_grad():
        online = st({"lm_state": state})
        batch = replay_batch(state, st.tokenizer.pad_token_id)
        replay = st(batch)
        alone = torch.cat([st({k: v[i : i + 1] for k, v in batch.items()}) for i in range(3)])
    assert torch.allclose(online, alone, **FP32_REORDER) and torch.allclose(replay, alone, **FP32_REORDER)


def test_paths_of_one_prompt_share_its_prefill_and_score_as_if_alone(any_lm):
    """Replay encodes each prompt once and each path's generated ids after it, right-padded
    and masked: rows of one prompt with other prefix lengths, in any order, score as each
    row alone (a full left-padded re-encode of its own prefix)."""
    st = fresh(any_lm)
    _, state = launched(st, until=6)
    tokens, *_ = state.tensors(st.tokenizer.pad_token_id)
    batch = shared_batch(st, state)
    rows, lens = [0, 2, 0, 1, 0, 2], [6, 2, 1, 4, 3, 6]
    with torch.no_grad():
        shared = st(batch)
        alone = torch.cat([st({k: v[i : i + 1] for k, v in batch.items()}) for i in range(len(rows))])
        prefixes = [st.tokenizer(PROMPTS[r])["input_ids"] + tokens[r][:n].tolist() for r, n in zip(rows, lens)]
        whole = torch.cat([st.score_cache(*st.encode([p])) for p in prefixes])
    assert torch.allclose(shared, alone, **FP32_REORDER) and torch.allclose(shared, whole, **FP32_REORDER)
    assert len(set(shared.tolist())) == len(rows)  # other prefixes, other scores: nothing vacuous


def shared_batch(st, state):
    """Rows of the three prompts with other prefix lengths, in mixed order."""
    tokens, *_ = state.tensors(st.tokenizer.pad_token_id)
    rows, lens = [0, 2, 0, 1, 0, 2], [6, 2, 1, 4, 3, 6]
    return {"prompt": [PROMPTS[r] for r in rows], "tokens": [tokens[r] for r in rows],
            "prefix_len": torch.tensor(lens, dtype=torch.float32)}


def test_kept_prefixes_score_as_encoded_and_are_encoded_once(any_lm, monkeypatch):
    """Training keeps the prefixes' K/V (LoRA-free) across calls: a second call encodes
    nothing and scores as the first (which encoded every row); a budget too small for
    every row keeps what fits and encodes the rest at every call."""
    st = fresh(any_lm)
    _, state = launched(st, until=6)
    batch = shared_batch(st, state)
    encoded = []
    encode = st.encode
    monkeypatch.setattr(st, "encode", lambda prefixes, lens=None: encoded.append(len(prefixes))
                        or encode(prefixes, lens))
    with torch.no_grad():
        plain = st(batch)
        st.keep_prefixes(1.0)
        first, n_first = st(batch), sum(encoded)
        second, n_second = st(batch), sum(encoded) - n_first
        assert torch.equal(first, plain) and n_first == 12 and n_second == 0
        assert torch.allclose(second, plain, **FP32_REORDER)
        full = st.prefixes.bytes
        st.keep_prefixes(full * 0.6 / 2**30)  # the first prompt's rows and some of the next
        st(batch)
        before = sum(encoded)
        again = st(batch)
        kept = len(st.prefixes.rows)
        assert 0 < kept < 6 and st.prefixes.bytes <= full * 0.6
        assert sum(encoded) - before == 6 - kept  # only what did not fit is encoded again
        assert torch.allclose(again, plain, **FP32_REORDER)
        # the same cut where the machine would have less free than the reserve for training
        st.keep_prefixes(1.0, free_gib=lambda: 2.0 + full * 0.6 / 2**30, reserve_gb=2.0)
        assert torch.allclose(st(batch), plain, **FP32_REORDER)
        assert len(st.prefixes.rows) == kept and st.prefixes.at_reserve
        st.keep_prefixes(1.0, free_gib=lambda: 1.5, reserve_gb=2.0)
        st(batch)
        assert not st.prefixes.rows and st.prefixes.bytes == 0


@pytest.mark.parametrize("budget_gb", [0, 1.0])
def test_first_losses_are_pinned_and_only_the_adapter_stop_and_head_train(tiny_lm, budget_gb):
    """The same losses whether the prefixes are encoded at every step or kept (budget_gb)."""
    st = fresh(tiny_lm, perturb=False)
    st.keep_prefixes(budget_gb)
    _, state = launched(st, until=4)
    batch = replay_batch(state, st.tokenizer.pad_token_id)
    batch.update(mc=torch.tensor([0.25, float("nan"), 1.0]), correct=torch.tensor([0.0, 1.0, 1.0]))
    frozen = {k: v.clone() for k, v in st.lm.state_dict().items() if "lora_" not in k}
    loss_fn = build_loss(LossConfig(name="reward_regression"))
    opt = torch.optim.AdamW(st.parameters(), lr=3e-3)
    losses = []
    for _ in range(3):
        loss = loss_fn(st(batch), batch)
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is not None for p in st.parameters())
        opt.step()
        losses.append(loss.item())
    print("first losses", losses)
    assert losses == pytest.approx([0.6282348, 0.6442229, 0.5819464], abs=1e-5)
    assert all(torch.equal(v, st.lm.state_dict()[k]) for k, v in frozen.items())
    n_lora = sum(p.numel() for p in st.lora.values())
    assert sum(p.numel() for p in st.parameters()) == n_lora + 32 + 33


def test_checkpoint_round_trip_and_mismatch(tiny_lm, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    st = fresh(tiny_lm)
    _, state = launched(st)
    batch = replay_batch(state, st.tokenizer.pad_token_id)
    spec = FeatureSpec("tiny", 32, [1])
    pred_cfg = OmegaConf.structured(PredictorConfig(name="super_token"))
    save_predictor(tmp_path / "st", st, pred_cfg, spec, "bank", {})
    again, meta = load_super_token(tmp_path / "st", copy.deepcopy(tiny_lm[0]), st.tokenizer, spec,
                                   pred_cfg)
    assert meta["predictor"]["n_tokens"] == 4 and meta["bank_key"] == "bank"
    with torch.no_grad():
        assert torch.equal(again(batch), st(batch))
    with pytest.raises(CheckpointMismatch, match="model_name"):
        load_super_token(tmp_path / "st", copy.deepcopy(tiny_lm[0]), st.tokenizer,
                         FeatureSpec("llama", 32, [1]), pred_cfg)
    other = LlamaForCausalLM(LlamaConfig(vocab_size=len(st.tokenizer), hidden_size=48,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64))
    with pytest.raises(CheckpointMismatch, match="hidden_size"):
        load_super_token(tmp_path / "st", other, st.tokenizer, spec, pred_cfg)


def test_config_and_bad_values():
    cfg = compose("train", ["predictor=super_token"])
    assert cfg.predictor.n_tokens == 4 and "down_proj" in cfg.predictor.lora_targets
    with pytest.raises(ConfigError, match="predictor"):
        validate(compose("train", ["predictor=super_token", "predictor.lora_rank=0"]))
    with pytest.raises(ConfigError, match="train.prefix_cache_gb"):
        validate(compose("train", ["predictor=super_token", "train.prefix_cache_gb=-1"]))
    # sized where the LM has loaded: a number below the memory free there, null half of it
    from stopexp.config.machine import free_memory_gib, prefix_cache_budget

    free = free_memory_gib(torch.device("cpu"))[0]
    with pytest.raises(ConfigError, match=r"^train.prefix_cache_gb: 100000 GiB is not below the .* GiB available"):
        prefix_cache_budget(100000, torch.device("cpu"))
    assert 0 < prefix_cache_budget(None, torch.device("cpu"))[0] <= free / 2 + 1
    assert prefix_cache_budget(0, torch.device("cpu"))[0] == 0 and prefix_cache_budget(0.5, "cpu")[0] == 0.5
    budget, free_now, reserve = prefix_cache_budget(None, torch.device("cpu"))
    assert reserve == budget / 2 and 0 < free_now() <= free + 1  # quarter and half of one reading
    # a memory setting: the trained predictor's key (its directory) is the same at any budget
    keys = {build.predictor_dir(cfg, build.feature_set(cfg)).name for cfg in
            (validate(compose("train", ["predictor=super_token", f"train.prefix_cache_gb={gb}"]))
             for gb in (0, 8, "null"))}
    assert len(keys) == 1


def test_train_and_evaluate_through_the_harness(small_bank):
    from stopexp.stages.evaluate import evaluate
    from stopexp.store import bank
    from stopexp.store.feature_sets import spec_of
    from stopexp.stages.build import predictor_dir, training_data
    from stopexp.training.fit import evaluate_scores, score
    from stopexp.stages.train import train_with_controls

    extra = ["predictor=super_token", "loss=reward_regression", "train.epochs=2"]
    cfg = validate(compose("train", [*small_bank, *extra]))
    metrics = train_with_controls(cfg, progress=False)
    assert metrics["parameters"] < 60_000 and np.isfinite(metrics["val"]["auroc_pooled"])
    root = bank.require_bank(build.bank(cfg))
    meta = bank.read_meta(root)
    st, _ = load_super_token(predictor_dir(cfg, build.feature_set(cfg)), *build.lm(cfg, progress=False), spec_of(cfg.tap.layers, meta),
                             cfg.predictor)
    test = training_data(cfg, build.feature_set(cfg), meta, prefixes=True)["test"]
    assert evaluate_scores(score(st, test), test)["auroc_pooled"] == metrics["test"]["auroc_pooled"]
    ev = validate(compose("evaluate", [*small_bank, *extra, "evaluate.methods=[learned]",
                                       "evaluate.text_metrics=false", "evaluate.bootstrap=50",
                                       "evaluate.n_points=[8]", "evaluate.retention=[4]",
                                       "policy.keep=4", "evaluate.mode=online"]))
    r = evaluate(ev)["methods"]["super_token"]
    assert 0 <= r["accuracy"] <= 1 and 0 < r["check_share"] < 1 and np.isfinite(r["auroc_pooled"])


def test_stop_attention_holds_the_prefix_constant_and_matches_the_models_attention(tiny_lm, monkeypatch):
    """[STOP]'s attention with the cached prefix detached (stopexp.models.stop_attention)
    gives the scores and the trained parameters' gradients of the LM's own attention, and
    is what every layer runs in the scoring call."""
    import contextlib

    import stopexp.models.stop_attention as sa
    import stopexp.models.super_token as super_token

    st = fresh(tiny_lm)
    _, state = launched(st, until=6)
    batch = shared_batch(st, state)
    batch.update(mc=torch.tensor([0.25, 0.5, 1.0, 0.0, 0.75, float("nan")]),
                 correct=torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 0.0]))
    loss_fn = build_loss(LossConfig(name="reward_regression"))
    calls = []
    attend = sa.prefix_constant_attention
    monkeypatch.setattr(sa, "prefix_constant_attention", lambda *a, **k: calls.append(1) or attend(*a, **k))
    sa.AttentionInterface.register(sa.NAME, sa.prefix_constant_attention)

    def scored():
        st.zero_grad(set_to_none=True)
        scores = st(batch)
        loss_fn(scores, batch).backward()
        return scores.detach(), {n: p.grad.clone() for n, p in st.named_parameters()}

    try:
        ours, ours_grads = scored()
        assert len(calls) == st.lm.config.num_hidden_layers  # one scoring call, every layer
        monkeypatch.setattr(super_token, "stop_attention", lambda lm: contextlib.nullcontext())
        theirs, their_grads = scored()
    finally:
        sa.AttentionInterface.register(sa.NAME, attend)
    assert st.lm.config._attn_implementation != sa.NAME  # switched back after the call
    assert torch.allclose(ours, theirs, **FP32_REORDER)
    for name, grad in ours_grads.items():
        assert torch.allclose(grad, their_grads[name], **FP32_REORDER), name
    assert any(g.abs().sum() > 0 for n, g in ours_grads.items() if "lora_A" in n)


def test_stop_attention_refuses_what_it_does_not_apply():
    from stopexp.models.stop_attention import prefix_constant_attention

    q, kv = torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 3, 4)
    out, _ = prefix_constant_attention(None, q, kv, kv, None, 0.5, sliding_window=None)
    assert out.shape == (1, 1, 2, 4)
    with pytest.raises(ValueError, match="softcap"):
        prefix_constant_attention(None, q, kv, kv, None, 0.5, softcap=30.0)


def test_stop_attention_keeps_the_half_precision_prefix_not_a_float32_copy():
    """In bfloat16 the [STOP] attention gives the output and query / new-key gradients of
    the same float32 computation with the prefix's float32 copies kept by autograd, and
    keeps for the backward no float32 tensor the size of the prefix."""
    from stopexp.models.stop_attention import prefix_constant_attention

    torch.manual_seed(0)
    B, heads, kv_heads, n, past, dim = 2, 4, 2, 3, 40, 8
    q = torch.randn(B, heads, n, dim, dtype=torch.bfloat16, requires_grad=True)
    prefix = torch.randn(2, B, kv_heads, past, dim, dtype=torch.bfloat16)
    new = torch.randn(2, B, kv_heads, n, dim, dtype=torch.bfloat16, requires_grad=True)
    key, value = (torch.cat([prefix[i], new[i]], 2) for i in (0, 1))
    saved = []

    def keep(t):
        saved.append((t.dtype, t.numel()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        out, _ = prefix_constant_attention(None, q, key, value, None, dim ** -0.5)
    grads = torch.autograd.grad(out.float().square().sum(), (q, new))
    assert not [s for s in saved if s[0] == torch.float32 and s[1] >= B * kv_heads * past * dim]

    # the reference: the prefix upcast once and detached, every product in float32
    qf = q.float().reshape(B, kv_heads, heads // kv_heads * n, dim)
    kf, vf = key.float(), value.float()
    scores = torch.cat([qf @ kf[:, :, :past].detach().transpose(-1, -2),
                        qf @ kf[:, :, past:].transpose(-1, -2)], -1) * dim ** -0.5
    w = torch.softmax(scores.view(B, kv_heads, heads // kv_heads, n, -1), -1).view(B, kv_heads, -1, past + n)
    ref = (w[..., :past] @ vf[:, :, :past].detach() + w[..., past:] @ vf[:, :, past:])
    ref = ref.view(B, heads, n, dim).transpose(1, 2).to(torch.bfloat16)
    assert torch.equal(out, ref)
    for got, want in zip(grads, torch.autograd.grad(ref.float().square().sum(), (q, new))):
        assert torch.allclose(got.float(), want.float(), **FP32_REORDER)
