"""The documentation: the site under docs/ builds with `mkdocs build --strict` (so a broken
link, anchor, snippet or nav entry fails), the README stays short and its relative links
resolve, every module path the README and the pages name exists, and the page of every
key and its default matches the composed config."""
import ast
import importlib.util
import os
import re
import shlex
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from conftest import ROOT, compose
from stopexp.core.names import REGISTRY

README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))
MAX_README_LINES = 300


def test_the_site_builds_strict(tmp_path):
    assert importlib.util.find_spec("mkdocs") and importlib.util.find_spec("material"), \
        "mkdocs / mkdocs-material missing: scripts/setup.sh installs requirements.txt"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                        str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # the results page shows the README's main-job table through the snippet
    html = (tmp_path / "site" / "results" / "index.html").read_text()
    assert "Launch-Check-Resume 64 -&gt; 8 at 5 tokens, 200 test prompts (replay)" in html


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    assert [p.name for p in PAGES if f" {p.relative_to(ROOT / 'docs')}" not in nav] == []


def test_the_readme_is_short_and_its_relative_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) < MAX_README_LINES
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if not re.match(r"[a-z]+:|#", t)
               and not (ROOT / t.split("#")[0]).exists()]
    assert missing == []


def test_the_readme_keeps_the_test_command_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/test.sh" in ci and "scripts/test.sh     # the test suite" in README.read_text()


def _defined(path, name: str) -> bool:
    """Whether module `path` defines or imports `name` at its top level."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and \
                any((a.asname or a.name.split(".")[0]) == name for a in node.names):
            return True
    return False


def _module_path(dotted: str):
    """The file of module `dotted` (a package's __init__.py), or None."""
    base = ROOT.joinpath(*dotted.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def named_paths(text: str) -> list[str]:
    """Every repository path and stopexp module named in the code spans of `text` that
    does not exist (a file, a `file.py::name` or a dotted `stopexp.module.name`)."""
    missing = []
    for span in re.findall(r"`([^`\n]+)`", text):
        for ref in re.findall(r"(?<![\w/.<])((?:stopexp|tests|scripts|conf|notebooks)/[\w/.-]*"
                              r"(?:::\w+)?)", span):
            file, _, name = ref.partition("::")
            path = ROOT / file
            if not path.exists() or (name and not _defined(path, name)):
                missing.append(ref)
        for ref in re.findall(r"(?<![\w/.])stopexp(?:\.\w+)+", span):
            parts = ref.split(".")
            cut = next((i for i in range(len(parts), 0, -1) if _module_path(".".join(parts[:i]))), 0)
            if cut == 0 or (cut < len(parts) and not _defined(_module_path(".".join(parts[:cut])),
                                                                 parts[cut])):
                missing.append(ref)
    return missing


def test_the_path_check_sees_a_moved_module():
    assert named_paths("`stopexp/feature_sets.py` `stopexp.store.feature_rows.tensors_at` "
                       "`stopexp.store.nothing` `tests/conftest.py::FP32_REORDER` "
                       "`tests/conftest.py::nothing` `python -m stopexp.collect`") == [
        "stopexp/feature_sets.py", "stopexp.store.nothing", "tests/conftest.py::nothing"]


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_path_named_exists(path):
    assert named_paths(path.read_text()) == []


def _fmt(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v or "''"
    if isinstance(v, list):
        return "[" + ", ".join(map(_fmt, v)) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    return repr(v)


SECTIONS = {"model", "model.toy", "model.thinking", "task", "tap", "tap.positions", "predictor", "loss", "policy",
            "search", "logger", "reward", "engine", "collect", "train", "evaluate", "adapt", "serve",
            "paths"}


def _leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict) and (f"{prefix}{k}" in SECTIONS or prefix.startswith("evaluate.")):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def test_the_key_page_lists_every_key_with_its_default():
    cfg = OmegaConf.to_container(compose("adapt", []), resolve=False)
    want = {k: _fmt(v).replace("|", "\\|") for k, v in _leaves(cfg) if k != "stage"}
    rows = re.findall(r"^\| `([\w.]+)` \| `(.*?)` \| ", (ROOT / "docs" / "config-keys.md").read_text(), re.M)
    shown = dict(rows)
    assert len(rows) == len(shown), "a key is listed twice"
    assert {k: shown.get(k) for k in want} == want
    assert shown.keys() - want.keys() == set()


# ---- every documented command composes and validates -------------------------------------
# Every `python -m stopexp.<stage> ...` and `scripts/main.sh ...` of the README and the pages
# (code blocks, with their `\` continuations, VAR="..." settings and loop variables, and code
# spans; a span with `...` elides arguments and is left out) is composed as Hydra will and
# validated, every job of a sweep included (stopexp.runtime.overrides.check_overrides): no
# compute, in this process. A console block whose next line is `error: ...` documents a
# refusal, and the command must be refused with that message.
HYDRA_STAGES = ("collect", "featurize", "train", "evaluate", "pipeline", "adapt", "toy_lm",
                "answers_replay", "serve")
COMMAND = re.compile(r"(?:python -m stopexp\.(\w+)|scripts/main\.sh)(?=\s|$)")
SETTING = re.compile(r"\s*(?:export\s+)?([A-Z_][A-Z0-9_]*)=(\"[^\"]*\"|'[^']*'|\S+)\s*$")
END = re.compile(r"\s(?:&&|\|\||;|\||&|>|2>|#)(?:\s|$)|;\s")
LOOP = re.compile(r"for (\w+) in (\S+)")
# Stand-ins for what this machine lacks: the answers-only banks the pages name (traces.json,
# /work/data/parallel-probe/*.json) are the user's files, so answers_replay's settings are
# checked with the bank shipped for tests; the vLLM and SLURM commands are for a GPU node,
# so the CUDA device count reads 8. The user's task and model files the pages name
# (task.path=/data/gsm8k_train.jsonl, model.gguf_file=/models/...) are composed as written:
# validate reads neither (loading them does, and names a missing one).
ANSWERS_BANK_STAND_IN = str(ROOT / "tests" / "data" / "answers_bank.json")
# docs/development.md's recipe predictor (low_rank, its yaml under /path/to/conf) is the one
# tests/test_outside_predictor.py writes and registers, as its recipe says
RECIPE_CONF = "file:///path/to/conf"


def _commands_in(line: str, env: dict, refused: str | None) -> list[tuple]:
    out = []
    for m in COMMAND.finditer(line):
        rest = END.split(line[m.end():] + " ")[0]
        for name, value in env.items():
            rest = re.sub(rf"\"?\$\{{?{name}\}}?\"?", lambda _: value, rest)
        out.append((m.group(1) or "main.sh", tuple(shlex.split(rest)), refused))
    return out


def documented_commands(text: str) -> list[tuple[str, tuple[str, ...], str | None]]:
    """(entry point, arguments, the documented error or None) of every command in `text`."""
    out = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S):
        lines, env = re.sub(r"\\\n\s*", " ", block).splitlines(), {}
        for i, line in enumerate(lines):
            setting, loop = SETTING.match(line), LOOP.search(line)
            if setting:
                value = setting.group(2)
                env[setting.group(1)] = shlex.split(value)[0] if value[0] in "\"'" else value
                continue
            if loop:  # the loop's first value stands for every one
                env[loop.group(1)] = loop.group(2)
            following = lines[i + 1] if i + 1 < len(lines) else ""
            refused = following[len("error: "):] if following.startswith("error: ") else None
            out += _commands_in(line, env, refused)
    for span in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text):
        if "..." not in span:
            out += _commands_in(span, {}, None)
    return out


def _all_documented() -> list:
    found = {}
    for path in [README, *PAGES]:
        for entry, args, refused in documented_commands(path.read_text()):
            found.setdefault((entry, args, refused), str(path.relative_to(ROOT)))
    slow = pytest.mark.slow  # an Optuna search space of 36 jobs: ~10 s each
    return [pytest.param(entry, args, refused, id=f"{page}: {entry} {' '.join(args)}"[:120],
                         marks=[slow] if any(a.startswith("+hparams_search=") for a in args) else [])
            for (entry, args, refused), page in found.items()]


def check_documented(entry: str, args: tuple[str, ...]) -> None:
    """Compose and validate one documented command (ConfigError / UserError if refused)."""
    from stopexp.runtime.overrides import check_overrides

    argv = list(args)
    if entry == "answers_replay":
        argv = [f"bank={ANSWERS_BANK_STAND_IN}" if a.startswith("bank=") else a for a in argv]
        argv = argv if any(a.startswith("bank=") for a in argv) else [f"bank={ANSWERS_BANK_STAND_IN}", *argv]
    if entry == "main.sh":  # scripts/main.sh: the pipeline, of +exp=toy_contrastive unless given one
        entry = "pipeline"
        argv = argv if any(a.startswith("+exp=") for a in argv) else ["+exp=toy_contrastive", *argv]
    assert entry in HYDRA_STAGES, f"python -m stopexp.{entry}: no such entry point"
    check_overrides(entry, argv, validate_run=True)


def test_the_pages_name_the_documented_commands():
    commands = [c for p in [README, *PAGES] for c in documented_commands(p.read_text())]
    assert len(commands) > 90
    assert ("collect", ("+exp=llama_contrastive", "engine=vllm", "search.top_p=1.0", "collect.rank=0",
                        "collect.world=8"), None) in commands  # a loop's variable, a continuation
    assert ("collect", ("-m", "+exp=llama_contrastive", "task=gsm8k", "task.path=/data/gsm8k_train.jsonl",
                        "hydra/launcher=submitit_slurm", "collect.rank=0,1,2,3", "collect.world=4"),
            None) in commands  # a VAR="..." setting
    assert [c for c in commands if c[2]] == [
        ("collect", ("reward=evaluate", "reward.module=bleu"),
         "reward.module: 'bleu' is neither a local file or directory nor in the evaluate cache "
         "(/root/.cache/huggingface/modules/evaluate_modules/metrics); give a local path, or run "
         "evaluate.load('bleu') once online to cache it")]


@pytest.mark.parametrize("entry, args, refused", _all_documented())
def test_every_documented_command_composes_and_validates(entry, args, refused, monkeypatch, tmp_path):
    from stopexp.config import machine
    from stopexp.core.errors import UserError

    monkeypatch.setattr(machine, "cuda_devices", lambda: 8)  # see the stand-ins above
    if any("low_rank" in a for a in args):
        from test_outside_predictor import write_package

        searchpath = write_package(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setitem(REGISTRY["predictor"], "low_rank", "low_rank_probe:LowRankProbe")
        args = tuple(a.replace(RECIPE_CONF, searchpath.partition("[")[2].rstrip("]")) for a in args)
    if refused is None:
        check_documented(entry, args)
        return
    with pytest.raises(UserError) as e:
        check_documented(entry, args)
    # the part before the first parenthesis: a cache path in it is the machine's
    assert str(e.value).startswith(refused.split(" (")[0]), str(e.value)


@pytest.mark.parametrize("script", [
    "sweep_policies.sh",  # each policy's budget where it is read (stopexp_where_read)
    pytest.param("sweep_retention.sh", marks=pytest.mark.slow),  # 12 jobs
    pytest.param("sweep_taps.sh", marks=pytest.mark.slow)])      # 18 jobs
def test_the_sweep_scripts_validate_every_job(script):
    text = re.sub(r"\\\n\s*", " ", (ROOT / "scripts" / script).read_text()).replace('"$@"', "")
    commands = [c for line in text.splitlines() for c in _commands_in(line, {}, None)]
    assert [entry for entry, _, _ in commands] == ["pipeline"]
    check_documented(*commands[0][:2])
