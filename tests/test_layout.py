"""The package layout holds: imports point one way down the floors, no import circle, no
library module reaches up into a stage, no file past ~400 lines, no duplicated block.

The graph is read from the source with `ast`, so an import inside a function counts as
much as one at the top of a module.
"""
from __future__ import annotations

import ast
import hashlib
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "stopexp"
ENTRY_POINTS = ("collect", "featurize", "train", "evaluate", "adapt", "pipeline", "answers_replay",
                "toy_lm")
# One floor per package: a package imports only the packages on floors below it (and its
# own modules), so no two packages import each other, directly or through others.
FLOORS = {"stages": 15, "serve": 14, "training": 13, "evaluation": 12, "engines": 11, "stopping": 10,
          "store": 9, "models": 8, "search": 7, "tasks": 6, "signals": 5, "metrics": 4,
          "runtime": 3, "config": 2, "core": 1}
ENTRY_FLOOR = 16
MAX_LINES = 400
DUPLICATE_LINES = 6


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the stopexp modules it imports (a name imported from a package counts as
    the submodule when it is one, else as the package)."""
    def known(name: str) -> str:
        while name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = defaultdict(set)
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.split(".")[0] == "stopexp":
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "stopexp"]
            else:
                continue
            graph[mod].update(t for t in map(known, targets) if t != mod)
    return graph


def floor(mod: str) -> int:
    parts = mod.split(".")
    if len(parts) == 2 and parts[1] in ENTRY_POINTS:
        return ENTRY_FLOOR  # the `python -m stopexp.<stage>` shims
    return FLOORS.get(parts[1], 0) if len(parts) > 1 else ENTRY_FLOOR


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` as a list of modules, or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(mod: str):
        state[mod] = 1
        path.append(mod)
        for dep in sorted(graph.get(mod, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        state[mod] = 2
        path.pop()
        return None

    for mod in sorted(graph):
        if mod not in state and (found := visit(mod)):
            return found
    return None


def test_the_cycle_finder_finds_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_circle():
    found = cycle(import_graph(modules()))
    assert found is None, "import circle: " + " -> ".join(found)


def test_every_package_has_a_floor():
    packages = {m.split(".")[1] for m in modules() if m.count(".") >= 1 and
                modules()[m].name == "__init__.py"}
    assert packages <= set(FLOORS)


def test_every_package_has_a_floor_of_its_own():
    assert len(set(FLOORS.values())) == len(FLOORS)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Package -> the other stopexp packages its modules import."""
    def package(mod: str) -> str:
        parts = mod.split(".")
        return parts[1] if len(parts) > 1 and parts[1] in FLOORS else "stopexp"

    out = {}
    for mod, deps in graph.items():
        out.setdefault(package(mod), set()).update(package(d) for d in deps if package(d) != package(mod))
    return out


def test_no_two_packages_import_each_other():
    found = cycle(package_graph(import_graph(modules())))
    assert found is None, "package circle: " + " -> ".join(found)


def test_the_package_check_sees_a_circle_through_a_third_package():
    graph = {"stopexp.metrics.a": {"stopexp.tasks.b"}, "stopexp.tasks.b": {"stopexp.search.c"},
             "stopexp.search.c": {"stopexp.metrics.d"}}
    assert cycle(package_graph(graph)) == ["metrics", "tasks", "search", "metrics"]


def test_imports_point_down_the_floors():
    up = sorted(f"{mod} -> {dep}" for mod, deps in import_graph(modules()).items() for dep in deps
                if dep != "stopexp" and floor(dep) > floor(mod))
    assert not up, "imports that point up:\n" + "\n".join(up)


def test_no_library_module_imports_a_stage():
    up = sorted(f"{mod} -> {dep}" for mod, deps in import_graph(modules()).items() for dep in deps
                if floor(mod) < FLOORS["stages"] <= floor(dep))
    assert not up, "\n".join(up)


@pytest.mark.parametrize("graph,bad", [({"stopexp.core.x": {"stopexp.stages.y"}}, True),
                                       ({"stopexp.stages.y": {"stopexp.core.x"}}, False)])
def test_the_floor_check_sees_an_upward_import(graph, bad):
    assert any(floor(d) > floor(m) for m, ds in graph.items() for d in ds) == bad


def test_no_file_past_the_line_limit():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, stripped text) of the lines that carry code: blank lines, comments,
    docstrings' lines shorter than a word and lone brackets say nothing twice."""
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if text and not text.startswith("#") and len(text) > 3:
            out.append((i, text))
    return out


def duplicated_blocks(paths, n: int = DUPLICATE_LINES) -> list[str]:
    seen, found = {}, []
    for path in paths:
        lines = code_lines(path)
        for k in range(len(lines) - n + 1):
            window = [t for _, t in lines[k:k + n]]
            if all(t.startswith(("from ", "import ")) for t in window):
                continue  # a shared run of imports is not shared logic
            key = hashlib.sha1("\n".join(window).encode()).hexdigest()
            where = f"{path.relative_to(PACKAGE.parent)}:{lines[k][0]}"
            if key in seen and not seen[key].startswith(f"{path.relative_to(PACKAGE.parent)}:"):
                found.append(f"{where} repeats {seen[key]}")
            seen.setdefault(key, where)
    return found


def test_the_duplicate_finder_finds_a_copied_block(tmp_path):
    block = "\n".join(f"value_{i} = compute({i}) + offset" for i in range(DUPLICATE_LINES))
    (tmp_path / "a.py").write_text(block + "\n")
    (tmp_path / "b.py").write_text("x = 1\n" + block + "\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path
    try:
        found = duplicated_blocks(sorted(tmp_path.glob("*.py")))
    finally:
        PACKAGE = saved
    assert len(found) == 1 and "b.py:2 repeats" in found[0]


def test_no_duplicated_block():
    found = duplicated_blocks(sorted(PACKAGE.rglob("*.py")))
    assert not found, "\n".join(found)


def imports_inside_functions(mods: dict[str, Path]) -> list[str]:
    """`module:line` of every stopexp import made inside a function: with no circle there is
    no reason to hide one (heavy third-party imports may still be deferred)."""
    found = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                             else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                    if any(n.split(".")[0] == "stopexp" for n in names):
                        found.append(f"{mod}:{node.lineno}")
    return sorted(set(found))


def test_no_stopexp_import_inside_a_function(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n    from stopexp.core import errors\n")
    assert imports_inside_functions({"m": tmp_path / "m.py"}) == ["m:2"]
    assert imports_inside_functions(modules()) == []


WHOLE_CONFIG_NAMES = ("cfg", "config")


def whole_config_takers(mods: dict[str, Path]) -> set[str]:
    """`module:function` (`module:Class.method`) of every function below the stages (config/,
    which validates the whole config, aside) with a parameter named cfg or config; a Hydra
    callback's hook, whose `config` Hydra passes by that name, is not one."""
    found = set()
    for mod, path in mods.items():
        if mod.split(".")[1:2] in (["stages"], ["config"]) or floor(mod) >= FLOORS["stages"]:
            continue
        tree = ast.parse(path.read_text(), str(path))
        scopes = [("", tree)] + [(f"{c.name}.", c) for c in ast.walk(tree) if isinstance(c, ast.ClassDef)]
        for prefix, scope in scopes:
            hooks = prefix and any(getattr(b, "id", getattr(b, "attr", "")) == "Callback" for b in scope.bases)
            for fn in scope.body if prefix else ast.walk(scope):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if not prefix and any(fn in c.body for _, c in scopes[1:]):
                    continue  # a method: named with its class below
                a = fn.args
                names = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
                if names & set(WHOLE_CONFIG_NAMES) and not (hooks and fn.name.startswith("on_")):
                    found.add(f"{mod}:{prefix}{fn.name}")
    return found


def test_the_whole_config_finder_sees_a_function_and_a_method(tmp_path):
    (tmp_path / "m.py").write_text("def f(cfg):\n    pass\n\n\nclass A:\n    def g(self, config):\n"
                                   "        pass\n\n\nclass H(Callback):\n    def on_run_start(self, config):\n"
                                   "        pass\n")
    assert whole_config_takers({"stopexp.models.m": tmp_path / "m.py",
                                "stopexp.stages.m": tmp_path / "m.py"}) == {
        "stopexp.models.m:f", "stopexp.models.m:A.g"}


def test_nothing_below_the_stages_takes_the_whole_config():
    found = whole_config_takers(modules())
    assert not found, "below the stages, these take the whole config (pass its sections, " \
        "plain values or objects built in stopexp/stages/build.py):\n" + "\n".join(sorted(found))
