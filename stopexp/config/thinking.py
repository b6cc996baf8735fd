"""model.thinking (conf/model/*.yaml): a model that reasons inside <think> ... end_tag
before its answer (DeepSeek-R1 and its distills, Qwen3, QwQ), and its checks.

enabled: null (the default) reads the text as any other model's and passes the chat template nothing;
true: the text after the first end_tag is the answer (no end_tag: no answer), reasoning
steps end at step_separator (tap.positions.step_ends), the bank counts each path's thinking
tokens, and the template's `enable_thinking` switch, where it has one, is set to true;
false: the switch is set to false (a hybrid model such as Qwen3 then answers without
thinking), which a template without the switch cannot do (an error at load).
max_thinking_tokens: s1's budget forcing: a path still thinking after that many generated
tokens gets end_tag's tokens forced next (engine=hf), then answers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from stopexp.config.ranges import at_least, fail


@dataclass
class ThinkingConfig:
    enabled: Optional[bool] = None   # null: not read as a thinking model; true | false: see above
    end_tag: str = "</think>"
    # the reasoning's step end (tap.positions.step_ends); escapes (\\n) decoded where used
    step_separator: str = "\\n\\n"
    max_thinking_tokens: Optional[int] = None  # then force end_tag (engine=hf); null: no budget


DEFAULTS = ThinkingConfig()


def thinks(model_cfg) -> bool:
    """Whether the model's paths are read as thinking, then answer."""
    t = model_cfg.get("thinking")
    return t is not None and t.enabled is True


def check_thinking(cfg) -> None:
    """model.thinking.*: the end tag and the separator are non-empty; the keys that only a thinking
    model reads stay at their defaults otherwise; the budget leaves room for an answer."""
    t = cfg.model.thinking
    if t.enabled is not None and cfg.model.name == "toy":
        fail("model.thinking.enabled", "the toy LM (model=toy) does not think; leave it unset")
    if t.enabled is False and not cfg.model.chat_template:
        fail("model.thinking.enabled", "false turns thinking off through the chat template's "
                                       "enable_thinking switch, but model.chat_template=false")
    if not thinks(cfg.model):
        for key in ("end_tag", "step_separator", "max_thinking_tokens"):
            if t[key] != getattr(DEFAULTS, key):
                fail(f"model.thinking.{key}", f"is read only with model.thinking.enabled=true, "
                                              f"not {t.enabled}; set that or leave this unset")
        return
    for key in ("end_tag", "step_separator"):
        if not t[key]:
            fail(f"model.thinking.{key}", "must be a non-empty string")
    if t.max_thinking_tokens is not None:
        at_least("model.thinking.max_thinking_tokens", t.max_thinking_tokens, 1)
        if t.max_thinking_tokens >= cfg.search.max_new_tokens:
            fail("model.thinking.max_thinking_tokens", f"{t.max_thinking_tokens} leaves no token for "
                                                       f"the answer within search.max_new_tokens="
                                                       f"{cfg.search.max_new_tokens}; allowed: 1.."
                                                       f"{cfg.search.max_new_tokens - 1}")
