"""The documentation: the site under docs/ builds with `mkdocs build --strict` (so a broken
link, anchor, snippet or nav entry fails), the README stays short and its relative links
resolve, every module path the README and the pages name exists, and the page of every
key and its default matches the composed config."""
import ast
import importlib.util
import os
import re
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from conftest import ROOT, compose

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
    assert named_paths("`stopexp/feature_bank.py` `stopexp.store.feature_rows.tensors_at` "
                       "`stopexp.store.nothing` `tests/conftest.py::FP32_REORDER` "
                       "`tests/conftest.py::nothing` `python -m stopexp.collect`") == [
        "stopexp/feature_bank.py", "stopexp.store.nothing", "tests/conftest.py::nothing"]


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
            "search", "logger", "reward", "engine", "collect", "train", "evaluate", "adapt", "paths"}


def _leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict) and f"{prefix}{k}" in SECTIONS:
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
