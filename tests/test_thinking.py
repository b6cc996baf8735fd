"""Thinking models (model.thinking): the chat template's enable_thinking switch, answers read
after the end tag, the reasoning's step separator, s1's budget forcing in the decode engine
(equal to HF generate run in two phases), and thinking / answer tokens counted apart."""
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForCausalLM

from conftest import FP32_REORDER, compose, featurized
from stopexp.config import ConfigError, validate
from stopexp.config.model import ModelConfig
from stopexp.config.thinking import ThinkingConfig
from stopexp.store.path_table import Paths
from stopexp.evaluation.accounting import outcome, summarize_outcome
from stopexp.models import prepare_tokenizer
from stopexp.models.tokenizer import CHARS, build_char_tokenizer
from stopexp.search.decode import Engine, SamplingParams
from stopexp.search.sample import prompt_ids
from stopexp.tasks import build_task
from stopexp.tasks.thinking import ThinkingTask, split_thinking, thinking_length
from stopexp.stages import build

END = "</think>"
# Qwen3's switch, in a template for the char tokenizer: on (the default) the turn opens the
# thinking; off, it writes an empty thinking block and the model answers at once
TEMPLATE = ("{%- for m in messages %}{{ m['content'] }}{%- endfor %}{%- if add_generation_prompt %}"
            "{{ '=' }}{%- if enable_thinking is defined and enable_thinking is false %}"
            "{{ '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{ '<think>\\n' }}{%- endif %}{%- endif %}")


def thinking_tokenizer(template=TEMPLATE):
    tok = build_char_tokenizer(CHARS + "<>/thinkaw\n")
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def thinking_lm():
    tok = thinking_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    return LlamaForCausalLM(cfg).eval(), tok


def model_cfg(enabled):
    return OmegaConf.structured(ModelConfig(name="tiny", path="x", thinking=ThinkingConfig(enabled=enabled)))


def rendered(enabled, template=TEMPLATE):
    tok = prepare_tokenizer(thinking_tokenizer(template), model_cfg(enabled))
    return tok.decode(prompt_ids(tok, "1+2"))


def test_the_template_switch_is_set_where_the_template_has_one():
    assert rendered(None) == rendered(True) == "1+2=<think>\n"
    assert rendered(False) == "1+2=<think>\n\n</think>\n\n"
    always = "{{ messages[0]['content'] }}{%- if add_generation_prompt %}{{ '=<think>\\n' }}{%- endif %}"
    assert rendered(True, always) == "1+2=<think>\n"  # a model that always thinks: left as it is
    with pytest.raises(ConfigError, match="^model.thinking.enabled: false sets the chat template's "
                                          "enable_thinking switch, but .* has none"):
        rendered(False, always)


def test_the_answer_is_what_follows_the_end_tag():
    task = build_task(compose("collect", []).task, ThinkingConfig(enabled=True))
    plain = build_task(compose("collect", []).task)
    assert isinstance(task, ThinkingTask) and task.name == "arith" and task.step_separator == "\n\n"
    p = task.problems("test", 1)[0]
    answer = plain.reference(p)  # the careful solution, ending in "#<answer>"
    assert plain.grade(p, answer)
    thought = f"<think>\nmaybe #{p.answer + 1}\n\nno\n{END}" + answer
    assert task.grade(p, thought) and task.answer_of(thought) == str(p.answer)
    assert not plain.grade(p, thought[: thought.index(END)])  # the thinking's #answer is wrong
    assert not task.grade(p, answer)  # no end tag: the path never answered
    assert task.answer_of(answer) == "" and task.answer_text(answer) == ""
    assert split_thinking("a</think>b</think>c", END) == ("a</think>", "b</think>c")
    assert split_thinking("abc", END) == ("abc", None)
    assert build_task(compose("collect", []).task, ThinkingConfig(enabled=None)).__class__ is plain.__class__


def test_thinking_length_counts_up_to_the_token_that_closes_the_tag():
    tok = thinking_tokenizer()
    for text in ["ab\n\n</think>1+2#3", "</think>", "no tag at all", "x</thin", "a</think></think>"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        brute = next((k for k in range(len(ids) + 1) if END in tok.decode(ids[:k])), len(ids))
        assert thinking_length(tok, ids, END) == brute
    assert thinking_length(tok, tok("ab</think>12", add_special_tokens=False)["input_ids"], END) == 10


def special_tags_tokenizer(*tags):
    """The char tokenizer with `tags` added as special tokens (one id each), as in
    tokenizers whose `</think>` is special."""
    from tokenizers import AddedToken

    tok = thinking_tokenizer()
    tok.add_tokens([AddedToken(t, special=True) for t in tags], special_tokens=True)
    return tok


def test_a_special_end_tag_survives_every_decode():
    from stopexp.core.token_text import stop_token_ids, text_of, texts_of
    from stopexp.search.stops import StopStrings
    from stopexp.search.budget_forcing import ThinkingBudget
    from stopexp.search.trace import prefix_holding

    tok = special_tags_tokenizer("<think>", END)
    task = build_task(compose("collect", []).task, ThinkingConfig(enabled=True))
    p = task.problems("test", 1)[0]
    answer = build_task(compose("collect", []).task).reference(p)
    ids = tok("<think>ak" + END + answer, add_special_tokens=False)["input_ids"]
    ids += [tok.eos_token_id, tok.pad_token_id]
    assert ids[0] == len(tok) - 2 and ids[3] == len(tok) - 1  # each tag is one special token
    assert tok.decode(ids, skip_special_tokens=True) == "ak" + answer  # the tag lost
    text = text_of(tok, ids)
    assert text == "<think>ak" + END + answer  # the tags stay, EOS and padding do not
    assert texts_of(tok, [ids, ids[:3]]) == [text, "<think>ak"]
    assert task.grade(p, text) and task.answer_of(text) == str(p.answer)
    assert thinking_length(tok, ids, END) == 4  # up to the tag, not the whole path
    assert prefix_holding(tok, ids, len("<think>ak" + END)) == 4
    assert StopStrings([END], tok).hits([ids[:3], ids[:4]]) == [False, True]
    assert ThinkingBudget(tok, END, 4).end_ids == [ids[3]]  # refused while the tag was skipped
    assert stop_token_ids(tok, (END, "\n")) == (ids[3],)  # for vLLM, which skips it in text
    # a configured end tag that is special: kept once the tokenizer is prepared for it
    tok = special_tags_tokenizer("<|eot|>")
    ids = tok("ak<|eot|>12", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert text_of(tok, ids) == "ak12"  # not a thinking model's tag: a control token
    cfg = OmegaConf.structured(ModelConfig(name="tiny", path="x", thinking=ThinkingConfig(
        enabled=True, end_tag="<|eot|>")))
    assert text_of(prepare_tokenizer(tok, cfg), ids) == "ak<|eot|>12"


def test_a_forced_special_end_tag_is_in_the_paths_text_and_ends_the_thinking():
    from stopexp.core.token_text import text_of, texts_of

    tok = special_tags_tokenizer("<think>", END)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)).eval()
    B = 5
    eng = _budget_engine((model, tok), max_new_tokens=12, do_sample=False, max_thinking_tokens=B)
    state = eng.run(eng.launch([prompt_ids(tok, "1+2"), prompt_ids(tok, "4*7")], [0, 1]))
    tokens, *_, lengths = state.tensors(tok.pad_token_id)
    for row, text in enumerate(texts_of(tok, [tokens[r, :n].tolist() for r, n in enumerate(lengths)])):
        ids = tokens[row, : lengths[row]].tolist()
        closed = ids.index(len(tok) - 1)  # the tag's one id: written, or forced at the budget
        assert closed <= B and END in text and text.index(END) == len(text_of(tok, ids[:closed]))
        assert thinking_length(tok, ids, END) == closed + 1


def _budget_engine(thinking_lm, **kw):
    model, tok = thinking_lm
    return Engine(model, tok.eos_token_id, tok.pad_token_id, SamplingParams(**kw), tokenizer=tok)


def test_budget_forcing_equals_hf_generate_in_two_phases(thinking_lm):
    model, tok = thinking_lm
    B, M = 6, 24
    end = tok(END, add_special_tokens=False)["input_ids"]
    eng = _budget_engine(thinking_lm, max_new_tokens=M, do_sample=False, max_thinking_tokens=B)
    prompts = [prompt_ids(tok, q) for q in ("4+7*3-9", "1-2", "9*9*9+1-0")]
    state = eng.run(eng.launch(prompts, [0, 1, 2]))
    tokens, *_, lengths = state.tensors(tok.pad_token_id)
    forced = 0
    for i, p in enumerate(prompts):
        gen = dict(do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        first = model.generate(torch.tensor([p]), max_new_tokens=B, **gen)[0, len(p):].tolist()
        theirs = first
        if END not in tok.decode(first) and tok.eos_token_id not in first:  # s1: close, go on
            forced += 1
            rest = model.generate(torch.tensor([p + first + end]), max_new_tokens=M - B - len(end),
                                  **gen)[0, len(p) + B + len(end):].tolist()
            theirs = first + end + rest
        ours = tokens[i, : lengths[i]].tolist()
        assert ours == theirs[: len(ours)] and (len(ours) == M or ours[-1] == tok.eos_token_id)
        # argmax is exact here, not luck of rounding: at every sampled position the top two
        # logits lie further apart than twice what two orders of summation can move a logit
        # (FP32_REORDER), so HF's prefill and our step-by-step decode pick the same token
        logits = model(torch.tensor([p + ours])).logits[0, len(p) - 1: len(p) + len(ours) - 1]
        top = logits.topk(2).values
        sampled = [t for t in range(len(ours)) if not B <= t < B + len(end)]
        assert (top[sampled, 0] - top[sampled, 1]).min() > 2 * FP32_REORDER["atol"]
    assert forced == 3  # the untrained LM never closes its thinking by itself


def test_forced_tokens_reach_sampled_paths_and_their_forks(thinking_lm):
    model, tok = thinking_lm
    B = 5
    end = tok(END, add_special_tokens=False)["input_ids"]
    eng = _budget_engine(thinking_lm, max_new_tokens=20, temperature=1.0, top_k=1, max_thinking_tokens=B)
    state = eng.launch([prompt_ids(tok, "1+2")] * 4, [10, 11, 12, 13])
    eng.run(state, until=3)
    child = eng.run(eng.fork(state, 2, list(range(8))))  # Monte Carlo rollouts keep the budget
    eng.run(state)
    for s in (state, child):
        tokens, logprob, *_, lengths = s.tensors(tok.pad_token_id)
        for r in range(len(lengths)):
            if lengths[r] > B + len(end):
                ids = tokens[r, : lengths[r]].tolist()
                offset = 0 if s is state else 3  # a fork's record starts at its step
                assert ids[B - offset: B - offset + len(end)] == end
                assert thinking_length(tok, ids, END) == B - offset + len(end)
                # top_k=1 gives a forced token no probability; it keeps the unfiltered one's
                assert torch.isfinite(logprob[r, : lengths[r]]).all()


def test_thinking_and_answer_tokens_are_counted_apart():
    # prompt 0: paths of 30 / 20 tokens thinking 25 / 20 (never closed); prompt 1: 10 of 4
    paths = Paths(group=np.array([0, 0, 1]), path_id=np.array([0, 1, 0]), length=np.array([30, 20, 10]),
                  correct=np.array([True, False, True]), answer=np.array(["1", "", "2"], dtype=object),
                  text=np.array(["", "", ""], dtype=object), alive=np.ones(3, bool), batch={},
                  thinking=np.array([25, 20, 4]))
    whole = summarize_outcome(outcome(paths, np.ones(3, bool), 8, 2), 0.0, 0.0, 10, 0)
    assert (whole["tokens_total"], whole["thinking_tokens"], whole["answer_tokens"]) == (60, 49, 11)
    # the second path pruned at 8 tokens: 8 of thinking
    pruned = summarize_outcome(outcome(paths, np.array([True, False, True]), 8, 2), 0.0, 0.0, 10, 0)
    assert (pruned["tokens_total"], pruned["thinking_tokens"], pruned["answer_tokens"]) == (48, 37, 11)
    plain = summarize_outcome(outcome(Paths(**{**paths.__dict__, "thinking": None}), np.ones(3, bool), 8, 2),
                      0.0, 0.0, 10, 0)
    assert "thinking_tokens" not in plain


@pytest.mark.parametrize("overrides,message", [
    (["model.thinking.max_thinking_tokens=8"], "model.thinking.max_thinking_tokens: is read only with "
                                               "model.thinking.enabled=true"),
    (["model.thinking.enabled=true"], "model.thinking.enabled: the toy LM"),
    (["model=smollm2", "model.thinking.enabled=true", "model.thinking.max_thinking_tokens=64",
      "search.max_new_tokens=64"], "model.thinking.max_thinking_tokens: 64 leaves no token"),
    (["model=smollm2", "model.thinking.enabled=true", "model.thinking.end_tag=''"],
     "model.thinking.end_tag: must be a non-empty string"),
    (["model=smollm2", "model.thinking.enabled=false", "model.chat_template=false"],
     "model.thinking.enabled: false turns thinking off"),
    (["model=smollm2", "model.thinking.enabled=true", "model.thinking.max_thinking_tokens=8",
      "engine=vllm"], "model.thinking.max_thinking_tokens: 8 is not served by engine=vllm"),
])
def test_thinking_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        validate(compose("collect", overrides))


def test_step_ends_and_the_bank_key_follow_the_thinking():
    base = ["model=smollm2", "tap.positions.step_ends=true", "task=datatotext", "task.format=chat",
            "task.stop=[]"]
    with pytest.raises(ConfigError, match="^tap.positions.step_ends: task datatotext has no step separator"):
        validate(compose("collect", base))
    cfg = validate(compose("collect", [*base, "model.thinking.enabled=true"]))  # "\n\n" now
    keys = {build.bank(validate(compose("collect", ["model=smollm2", *o]))).key for o in (
        [], ["model.thinking.enabled=true"], ["model.thinking.enabled=true", "model.thinking.max_thinking_tokens=8"])}
    assert len(keys) == 3 and cfg.model.thinking.step_separator == "\\n\\n"
    # the overrides docs/thinking.md shows for the R1 distill
    validate(compose("pipeline", ["+exp=llama_contrastive", "model=qwen", "model.thinking.enabled=true",
                                  "model.thinking.max_thinking_tokens=1536", "search.max_new_tokens=2048"]))


@pytest.fixture(scope="module")
def thinking_bank(thinking_lm, tmp_path_factory):
    """A bank of the tiny thinking LM under a budget of 6 thinking tokens: (the overrides
    that compose its config, collect's summary)."""
    from stopexp.stages.collect import collect

    model, tok = thinking_lm
    tmp = tmp_path_factory.mktemp("thinking")
    model.save_pretrained(tmp / "thinky")
    tok.save_pretrained(tmp / "thinky")  # with its chat template, which has the switch
    overrides = [
        "model=llama", f"model.path={tmp / 'thinky'}", "model.name=thinky", "model.attn_implementation=null",
        "model.thinking.enabled=true", "model.thinking.max_thinking_tokens=6", "search.max_new_tokens=20",
        f"paths.output_dir={tmp / 'out'}", "logger=none", "search.n_paths=4", "collect.prompts.train=2",
        "collect.prompts.val=1", "collect.prompts.test=2", "collect.shard_prompts=2",
        "collect.mc_rollouts=2"]
    return overrides, collect(build.collection(validate(compose("collect", overrides))))


def test_collect_with_a_thinking_model_counts_its_thinking(thinking_lm, thinking_bank):
    from stopexp.store import bank

    _, tok = thinking_lm
    overrides, summary = thinking_bank
    ds = bank.load_bank(build.bank(validate(compose("collect", overrides))).root)
    end = tok(END, add_special_tokens=False)["input_ids"]
    thinking = list(ds["thinking_tokens"][:])
    assert thinking == [thinking_length(tok, list(t), END) for t in ds["tokens"][:]]
    for ids, n in zip(map(list, ds["tokens"][:]), thinking):
        if len(ids) >= 6 + len(end):  # still thinking at the budget: closed by force
            assert ids[6: 6 + len(end)] == end and n == 6 + len(end)
    assert summary["thinking_tokens"] == sum(thinking)
    assert summary["thinking_tokens"] + summary["answer_tokens"] == summary["tokens_total"] == sum(ds["length"][:])


def test_online_evaluate_counts_thinking_as_replay_does(thinking_bank):
    """Online Launch-Check-Resume of the thinking LM splits each method's tokens into
    thinking and answer exactly as the replay of its bank does (the paths draw the same
    tokens; a pruned path's share is its prefix's)."""
    from stopexp.stages.evaluate import evaluate

    overrides, _ = thinking_bank
    common = [*overrides, "evaluate.methods=[confidence]", "evaluate.text_metrics=false",
              "evaluate.bootstrap=10", "search.check_at=0.25", "policy.keep=2"]
    replay = evaluate(featurized(validate(compose("evaluate", common))))["methods"]
    online = evaluate(validate(compose("evaluate", [*common, "evaluate.mode=online"])))["methods"]
    assert replay["no_prune"]["thinking_tokens"] > replay["confidence"]["thinking_tokens"] > 0
    for name in ("no_prune", "random", "confidence", "oracle"):
        for key in ("tokens_total", "thinking_tokens", "answer_tokens"):
            assert online[name][key] == replay[name][key], (name, key)
