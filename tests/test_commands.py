"""Every command stopexp prints runs as printed: written by stopexp.core.commands, whose
words bash reads back as the exact argv, and whose built overrides Hydra reads back as the
exact value, for awkward values (non-ASCII, spaces, quotes, brackets, `=`, `$`, newlines);
no module writes such a command by hand."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from conftest import ROOT
from stopexp.core.commands import make_with, override, shell_word, stage_command
from stopexp.core.errors import NotMade

AWKWARD = ["介绍", "a b", "it's", 'say "hi"', "[x]", "{x}", "a=b", "a,b", "$HOME", "`ls`", "${oc.env:HOME}",
           "back\\", "\\'", "\n\nQuestion:", "tab\there", "", "null", "true", "1", "\u2028x", "*", "~/x"]
VALUES = [*AWKWARD, 1e22, float("inf"), -3, 0.5, None, True, ["介绍", "a b"], {"train": 3, "val": "x y"}]
# overrides as a user types them (after the shell took its own quotes)
TYPED = ['search.stop=["介绍"]', "task.name='a b'", 'x="it\'s"', "+exp=toy_contrastive",
         "hydra.searchpath=[file:///tmp/my plugins]", "~logger", "paths.output_dir=/tmp/a$b"]


def argv_of(line: str) -> list[str]:
    """The words bash makes of a command line (its program name included)."""
    done = subprocess.run(["bash", "-c", f"printf '%s\\0' {line}"], capture_output=True, check=True)
    return [w.decode() for w in done.stdout.split(b"\0")[:-1]]


def read_back(line: str):
    value = OverridesParser.create().parse_override(line).value()
    return OmegaConf.to_container(OmegaConf.create({"v": value}), resolve=True)["v"]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_a_built_override_reads_back_as_its_value_through_bash_and_hydra(value):
    line = override("search.stop", value)
    assert read_back(line) == value
    printed = stage_command("collect", [line])
    assert "\n" not in printed
    assert argv_of(printed) == ["python", "-m", "stopexp.collect", line]


def test_the_stop_string_of_the_report_is_quoted_for_the_shell():
    assert stage_command("collect", ['search.stop=["介绍"]']) == \
        """python -m stopexp.collect 'search.stop=["介绍"]'"""
    assert override("search.stop", ["介绍"]) == 'search.stop=["介绍"]'
    assert shell_word("a\nb") == "$'a\\nb'"


def printed_messages(overrides):
    """What every printer says for a missing or damaged artifact, with `overrides`."""
    from stopexp.store.feature_sets import repair_text

    yield "collect", str(NotMade("trace bank", "/x", "collect", overrides=overrides))
    yield "toy_lm", str(NotMade("toy LM", "/x", "toy_lm", "damaged", overrides))
    yield "featurize", repair_text(overrides)
    yield "train", make_with("train", overrides)


@pytest.mark.parametrize("typed", [[t] for t in TYPED] + [TYPED, [override("k", v) for v in VALUES]])
def test_every_printer_repeats_the_command_line_as_bash_reads_it(typed):
    for stage, message in printed_messages(typed):
        command = stage_command(stage, typed)
        assert command in message and "\n" not in message
        assert argv_of(command)[3:] == typed
    pipeline = stage_command("pipeline", typed)
    assert pipeline in make_with("train", typed) and argv_of(pipeline)[3:] == typed


def test_no_module_writes_a_command_by_hand():
    """An f-string that writes `python -m ...` with a value in it is a command printed
    without quoting: only stopexp.core.commands writes them."""
    found = []
    for path in [*(ROOT / "stopexp").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]:
        if path.name == "commands.py" and path.parent.name == "core":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.JoinedStr):
                continue
            for part, after in zip(node.values, node.values[1:]):  # a value right after `python -m ...`
                tail = part.value.rpartition("-m ")[2] if isinstance(part, ast.Constant) and \
                    "-m " in part.value else None
                if tail is not None and isinstance(after, ast.FormattedValue) and not set(tail) & set(";:()"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_a_printed_command_with_a_non_ascii_stop_runs_as_printed(tmp_path):
    """train on an empty cache names the collect command; that command, pasted into bash,
    composes and validates the same config (Hydra's --cfg job prints it, nothing runs)."""
    typed = ['search.stop=["介绍", "a b"]', f"paths.output_dir={tmp_path}", "logger=none"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "stopexp.train", *typed], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    command = stage_command("collect", typed)
    assert f"make it with: {command} (or " in done.stderr
    shown = subprocess.run(["bash", "-c", f"{command} --cfg job"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert OmegaConf.create(shown.stdout).search.stop == ["介绍", "a b"]
