import pytest
import torch

from conftest import FP32_REORDER
from stopexp.core.seeds import stream_seed
from stopexp.search.decode import Engine, SamplingParams, choose_tokens, sampling_distribution
from stopexp.search.taps import Taps

PROMPTS = ["4+7*3-9?", "1-2?", "9*9*9+1-0?"]


def _engine(tiny_lm, **kw):
    model, tok = tiny_lm
    taps = kw.pop("taps", None)
    ckpts = kw.pop("checkpoints", ())
    return Engine(model, tok.eos_token_id, tok.pad_token_id, SamplingParams(**kw), taps, ckpts)


def _ids(tok, prompts):
    return [tok(p)["input_ids"] for p in prompts]


def test_greedy_equals_hf_generate(tiny_lm):
    model, tok = tiny_lm
    eng = _engine(tiny_lm, max_new_tokens=20, do_sample=False)
    state = eng.run(eng.launch(_ids(tok, PROMPTS), [0, 1, 2]))
    tokens, *_, lengths = state.tensors(tok.pad_token_id)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    ref = model.generate(**enc, max_new_tokens=20, do_sample=False, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id)[:, enc["input_ids"].shape[1]:]
    for i in range(len(PROMPTS)):
        ours = tokens[i, : lengths[i]].tolist()
        theirs = ref[i].tolist()
        assert ours == theirs[: len(ours)]
        if len(ours) < 20:
            assert ours[-1] == tok.eos_token_id


def test_paths_do_not_depend_on_batch_mates_or_pruning(tiny_lm):
    model, tok = tiny_lm
    seeds = [stream_seed(0, "p", j) for j in range(8)]
    eng = _engine(tiny_lm, max_new_tokens=24, temperature=1.0)
    full = eng.run(eng.launch(_ids(tok, PROMPTS[:1]) * 8, seeds))
    full_tok, *_ , full_len = full.tensors(tok.pad_token_id)
    # alone
    solo = eng.run(eng.launch(_ids(tok, PROMPTS[:1]), seeds[3:4]))
    solo_tok, *_, solo_len = solo.tensors(tok.pad_token_id)
    assert solo_tok[0, : solo_len[0]].tolist() == full_tok[3, : full_len[3]].tolist()
    # pruned after 5 tokens: survivors are unchanged, pruned rows left the cache
    state = eng.launch(_ids(tok, PROMPTS[:1]) * 8, seeds)
    eng.run(state, until=5)
    state.keep_paths(torch.tensor([1, 6]))
    assert state.size <= 2 and state.cache.layers[0].keys.shape[0] == state.size
    eng.run(state)
    tok_p, *_, len_p = state.tensors(tok.pad_token_id)
    for j in (1, 6):
        assert tok_p[j, : len_p[j]].tolist() == full_tok[j, : full_len[j]].tolist()


def test_per_token_logprob_and_entropy(tiny_lm):
    model, tok = tiny_lm
    eng = _engine(tiny_lm, max_new_tokens=6, temperature=0.7, top_k=5)
    state = eng.run(eng.launch(_ids(tok, PROMPTS[:1]), [7]))
    tokens, lp, ent, conf, n = state.tensors(tok.pad_token_id)
    ids = torch.tensor([_ids(tok, PROMPTS[:1])[0] + tokens[0, : n[0]].tolist()])
    logits = model(ids).logits[0, -n[0] - 1 : -1]
    logp, _ = sampling_distribution(logits, eng.params)
    ref = logp.gather(-1, tokens[0, : n[0], None]).squeeze(-1)
    assert torch.allclose(lp[0, : n[0]], ref, **FP32_REORDER)
    p = logp.exp()
    assert torch.allclose(ent[0, : n[0]], -(p * logp.nan_to_num(neginf=0)).sum(-1), **FP32_REORDER)
    assert ((p > 0).sum(-1) <= 5).all()


def test_top_p_keeps_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    logp, _ = sampling_distribution(logits, SamplingParams(top_p=0.7))
    assert torch.isfinite(logp[0, :2]).all() and torch.isinf(logp[0, 2:]).all()


@pytest.mark.parametrize("params", [
    SamplingParams(top_p=1e-300),   # 0 in float32: it dropped every token (NaN log-probs)
    SamplingParams(top_p=1e-45),    # float32's smallest subnormal
    SamplingParams(top_k=1),
    SamplingParams(temperature=1e-4, top_p=0.5),
])
def test_extreme_sampling_takes_the_likeliest_token(params):
    logits = torch.tensor([[0.1, 2.0, 1.0, -1.0], [3.0, -2.0, 0.0, 2.5]])
    logp, _ = sampling_distribution(logits, params)
    # the u at both ends of [0, 1): u = 0 picked the zero-mass token 0 of the first row
    for u in (0.0, 0.5, 1 - 2**-53):
        assert choose_tokens(logp, torch.full((2,), u, dtype=torch.float64), True).tolist() == [1, 0]


def test_taps_keep_checkpoint_features_and_remove_hooks(tiny_lm):
    model, tok = tiny_lm
    seeds = [stream_seed(1, "q", j) for j in range(4)]
    ids = _ids(tok, PROMPTS[:1]) * 4
    before = [len(layer._forward_hooks) for layer in model.model.layers]
    with Taps(model, [-1, 0], "last") as taps:
        eng = _engine(tiny_lm, max_new_tokens=12, taps=taps, checkpoints=(3,))
        state = eng.run(eng.launch(ids, seeds))
    assert [len(layer._forward_hooks) for layer in model.model.layers] == before
    rows, feats = state.features[3]
    assert feats.shape == (len(rows), 2, 32)
    tokens, *_ = state.tensors(tok.pad_token_id)
    j = int(rows[0])
    full = torch.tensor([ids[j] + tokens[j, :3].tolist()])
    hs = model(full, output_hidden_states=True).hidden_states
    assert torch.allclose(feats[0, 0], hs[1][0, -1], **FP32_REORDER)  # layer 0 (taps: shallowest first)


def test_taps_removed_on_error(tiny_lm):
    model, _ = tiny_lm
    before = [len(layer._forward_hooks) for layer in model.model.layers]
    with pytest.raises(RuntimeError):
        with Taps(model, [0], "mean"):
            assert len(model.model.layers[0]._forward_hooks) == before[0] + 1
            raise RuntimeError("boom")
    assert [len(layer._forward_hooks) for layer in model.model.layers] == before


def test_bad_tap_layer_and_checkpoint(tiny_lm):
    model, _ = tiny_lm
    with pytest.raises(ValueError, match="tap.layers"):
        Taps(model, [2])
    with pytest.raises(ValueError, match="checkpoints"):
        _engine(tiny_lm, max_new_tokens=8, checkpoints=(8,))


def test_a_fork_on_a_sliding_window_lm_continues_as_the_original(sliding_lm):
    """Its cache holds only the window, and the masks count every position seen: forked
    left-padded rows get the original's next logits."""
    tok = sliding_lm[1]
    eng = _engine(sliding_lm, max_new_tokens=16)
    state = eng.run(eng.launch(_ids(tok, PROMPTS), [3, 4, 5]), until=4)
    assert state.size == 3 and not state.attention_mask.all()  # rows of other lengths: padding
    assert all(layer.keys.shape[2] == 5 < layer.cumulative_length for layer in state.cache.layers)
    same = eng.fork(state, 1, [0] * state.size)
    same.uniforms = state.uniforms.clone()
    eng.run(same, until=6)
    eng.run(state, until=6)
    assert same.size == state.size and torch.equal(same.next_logits, state.next_logits)


def test_fork_shares_the_prefix_and_leaves_the_original(tiny_lm):
    model, tok = tiny_lm
    eng = _engine(tiny_lm, max_new_tokens=16)
    state = eng.launch(_ids(tok, PROMPTS[:2]), [1, 2])
    eng.run(state, until=4)
    before = [l.keys.clone() for l in state.cache.layers]
    child = eng.fork(state, 3, [stream_seed("mc", i) for i in range(state.size * 3)])
    eng.run(child)
    assert all(torch.equal(a, l.keys) for a, l in zip(before, state.cache.layers))
    # a forked row with the original's stream continues exactly like the original
    alive = state.paths.tolist()
    same = eng.fork(state, 1, [0] * state.size)
    same.uniforms = state.uniforms.clone()
    eng.run(same)
    eng.run(state)
    t_same, *_, n_same = same.tensors(tok.pad_token_id)
    t_orig, *_, n_orig = state.tensors(tok.pad_token_id)
    assert alive
    for r, j in enumerate(alive):
        assert t_same[r, : n_same[r] - 4].tolist() == t_orig[j, 4 : n_orig[j]].tolist()
