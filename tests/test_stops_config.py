"""Stop strings as config values: validated, keying the bank, their escapes (and those
of every text key) decoded once while LaTeX commands stay, and an engine refusing stop
strings it cannot match."""
import json

import pytest

from conftest import compose
from stopexp.config import ConfigError, validate
from stopexp.core.config_text import decode_escapes, decoded_text
from stopexp.search.decode import Engine, SamplingParams, make_engine
from stopexp.stages import build
from stopexp.stages.build import sampling
from stopexp.tasks import build_task


def test_engine_needs_the_tokenizer_for_stop_strings_and_refuses_empty_ones(tiny_lm):
    model, tok = tiny_lm
    with pytest.raises(ValueError, match="tokenizer"):
        Engine(model, tok.eos_token_id, tok.pad_token_id, SamplingParams(stop=("x",)))
    with pytest.raises(ValueError, match="search.stop: entry 1 is empty"):
        make_engine(model, tok, SamplingParams(stop=("x", "")))


def test_stop_strings_change_the_bank_and_are_validated(tmp_path):
    base = ["logger=none", f"paths.output_dir={tmp_path}"]
    plain = validate(compose("collect", base))
    stopped = validate(compose("collect", [*base, "search.stop=['Question:']"]))
    assert list(stopped.search.stop) == ["Question:"] and build.bank(plain).key != build.bank(stopped).key
    with pytest.raises(ConfigError, match="search.stop: every stop string must be non-empty"):
        validate(compose("collect", [*base, "search.stop=['#','']"]))


def test_escapes_in_stop_strings_and_text_keys_are_decoded_once(tmp_path):
    """Hydra hands `search.stop='["\n\nQuestion:"]'` over with a literal backslash-n: the
    text keys decode \\n, \\t, \\r and \\\\ once (other backslashes stay), so the README's
    form stops where a newline-written config does, in the same bank."""
    base = ["logger=none", f"paths.output_dir={tmp_path}", "task=wordprob", "task.format=chat"]
    escaped = validate(compose("collect", [
        *base, r'search.stop=["\n\nQuestion:","a\\nb","\boxed"]', r"task.stop=['\t']",
        r"task.instruction='Solve.\nThink.'"]))
    assert list(escaped.search.stop)[0] == "\\n\\nQuestion:"  # as Hydra delivers it
    assert sampling(escaped).stop == ("\t", "\n\nQuestion:", "a\\nb", "\\boxed")
    assert build_task(escaped.task).stop_sequences == ("\t",)
    assert build_task(escaped.task).instruction == "Solve.\nThink."
    # written with the characters themselves (a YAML "\n" is one): the same stops, one bank
    literal = validate(compose("collect", [*base, "task.stop=['\t']",
                                           "task.instruction='Solve.\nThink.'"]))
    literal.search.stop = ["\n\nQuestion:", "a\\\\nb", "\\boxed"]  # two backslashes: one
    assert sampling(literal).stop == sampling(escaped).stop
    assert build.bank(literal).key == build.bank(escaped).key


def test_escapes_that_start_latex_commands_stay(tmp_path):
    """A prompt template, an instruction, a stop and a thinking tag that hold LaTeX keep it:
    \\theta, \\text{}, \\neq, \\right) start commands, not a TAB, a newline or a CR."""
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"problem": "What is 2+2?", "solution": "\\boxed{4}"}) + "\n")
    latex = r"Let $\theta \neq 0$, \text{so} $\left(x\right)$ \times \tfrac12 \nabla \rangle"
    cfg = validate(compose("collect", [
        "logger=none", f"paths.output_dir={tmp_path}", "task=math", f"task.path={data}",
        f"task.prompt_template='{{question}}\\n{latex}\\tEnd'", "model=smollm2",
        r"task.stop=['\right)\n']", "model.thinking.enabled=true",
        r"model.thinking.step_separator='\n\n\text{step}'"]))
    task = build_task(cfg.task)
    prompt = next(row[1] for rows in task._by_split.values() for row in rows)
    assert prompt == f"What is 2+2?\n{latex}\tEnd"
    assert sampling(cfg).stop[0] == "\\right)\n"
    assert decode_escapes(cfg.model.thinking.step_separator) == "\n\n\\text{step}"
    assert decoded_text({"instruction": r"Use \text{km}\nThen \rho", "stop": [r"\neq\n", r"\t"],
                         "prompt_template": r"\right)\r"}) == {
        "instruction": "Use \\text{km}\nThen \\rho", "stop": ["\\neq\n", "\t"], "prompt_template": "\\right)\r"}
    for text, want in [(r"\n\nQuestion:", "\n\nQuestion:"), (r"\nthe", "\nthe"), (r"\nu", r"\nu"),
                       (r"\not", r"\not"), (r"\nnot", "\nnot"), (r"\r\n", "\r\n"),
                       (r"a \\ b", r"a \\ b"), (r"\\nb", r"\nb"), (r"\\text", r"\text")]:
        assert decode_escapes(text) == want, text
