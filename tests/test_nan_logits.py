"""NaN logits fail at once, naming the decode step and the path (sampling engine, beam
search and the bank's sampled paths)."""
import pytest

from stopexp.search.beam import beam_search
from stopexp.search.decode import SamplingParams, make_engine

PROMPT = "4+7*3-9?"


def _nan_after(model, step: int, row: int):
    """A hook making the LM head emit NaN for batch row `row` from decode step `step` on."""
    calls = {"n": 0}

    def hook(module, args, out):
        calls["n"] += 1
        if calls["n"] > step and out.shape[0] > row:
            out = out.clone()
            out[row] = float("nan")
        return out
    return model.lm_head.register_forward_hook(hook)


def test_nan_logits_fail_naming_step_and_path(tiny_lm):
    model, tok = tiny_lm
    eng = make_engine(model, tok, SamplingParams(max_new_tokens=8))
    ids = tok(PROMPT)["input_ids"]
    handle = _nan_after(model, 2, 1)
    try:
        with pytest.raises(FloatingPointError, match=r"decode step 2: .* 1 of 2 rows "
                                                     r"\(prompt 7 path 1\)"):
            eng.run(eng.launch([ids] * 3, [0, 1, 2], [f"prompt 7 path {j}" for j in range(3)]))
    finally:
        handle.remove()
    handle = _nan_after(model, 2, 1)
    try:
        with pytest.raises(FloatingPointError, match=r"decode step 2: .*\(beam 1\)"):
            beam_search(model, ids, beam_width=2, max_new_tokens=8, eos_ids=tok.eos_token_id,
                        pad_id=tok.pad_token_id)
    finally:
        handle.remove()


def test_sampled_paths_name_their_prompt_on_nan(tiny_lm):
    from stopexp.search.sample import sample_paths
    from stopexp.tasks import ArithTask

    model, tok = tiny_lm
    task = ArithTask(n_steps=3)
    problems = task.problems("test", 2)
    eng = make_engine(model, tok, SamplingParams(max_new_tokens=6))
    handle = _nan_after(model, 1, 2)
    try:
        with pytest.raises(FloatingPointError,
                           match=rf"prompt {problems[1].prompt_id} \(test\) path 0"):
            sample_paths(eng, tok, task, problems, 2, seed=0)
    finally:
        handle.remove()
