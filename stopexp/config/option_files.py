"""An option's yaml sets only the keys of the schema it extends. A composed section holds
its group's view, every option's keys (stopexp.config.options), so Hydra merges a key of
another option written in an option's yaml without a word: at its default nothing would
read it, off it `check_unread` would name the key but not the file. This check reads the
option files a composition used (Hydra's runtime: the group choices and the config
sources, in search-path order) and refuses such a key whatever its value, naming the
file, the key and the keys the option has.

The same files are read for their bool keys (`check_bool_files`): OmegaConf merges 2 or
"yes" written in a yaml into a bool key as true, so the value is checked as written."""
from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any, Iterator

from omegaconf import OmegaConf

from stopexp.config.limits import is_bool, leaves
from stopexp.config.options import Group
from stopexp.config.ranges import fail
from stopexp.config.root import GROUPS


def check_option_files(cfg, runtime) -> None:
    """Every top-level key of the yaml chosen for each group (`runtime.choices`) and of the
    same-group yamls it extends is a key of the option its section is typed as."""
    for g in GROUPS:
        choice = runtime.choices.get(g.name)
        if choice is None or g.name not in cfg:
            continue
        option = option_of(g, cfg[g.name])
        own = g.keys(option)
        if option not in g.options:  # no schema: the keys its yaml adds are its own
            own = (*own, *(k for k in cfg[g.name] if k not in g.view_keys()))
        for path, keys in option_keys(g.name, choice, runtime.config_sources):
            for key in keys:
                if key not in own:
                    others = "|".join(g.readers(key)) or "no option"
                    fail(f"{g.name}.{key}", f"set in {path} ({g.name}={choice}, which extends "
                                            f"{option}_schema), but only {g.name}={others} read "
                                            f"it; {g.name}={option}'s keys: {', '.join(own)}")


def option_of(group: Group, section) -> str:
    """The option whose schema `section` is typed as (the one its yaml extends), else the
    one the group's rule picks (`Group.chosen`)."""
    typed = [o for o, schema in group.options.items() if OmegaConf.get_type(section) is schema]
    return typed[0] if typed else group.chosen(section)


def option_keys(group: str, choice: str, sources) -> Iterator[tuple[str, list[str]]]:
    """(file, its top-level keys but `defaults`) of each of `group_files` whose keys land in
    the group's section."""
    for found in group_files(group, choice, sources):
        if _package(found) in (None, "_group_", group):  # else its keys land elsewhere
            yield str(found), [k for k in OmegaConf.load(found) if k != "defaults"]


def group_files(group: str, choice: str, sources, seen=()) -> Iterator[Any]:
    """`<group>/<choice>.yaml`, the first on the search path, then each yaml of the same
    group in its defaults list, in turn (a `<option>_schema` there is a structured config,
    not a file)."""
    found = find_config_file(f"{group}/{choice}.yaml", sources)
    if found is None or found in seen:
        return
    yield found
    for entry in OmegaConf.load(found).get("defaults", []):
        if isinstance(entry, str) and entry != "_self_" and "@" not in entry:
            parent = entry[1:] if entry.startswith("/") else f"{group}/{entry}"
            if parent.startswith(f"{group}/") and "/" not in parent[len(group) + 1:]:
                yield from group_files(group, parent[len(group) + 1:], sources, (*seen, found))


def check_bool_files(runtime) -> None:
    """Every bool key set in a yaml that the composition read (`runtime.choices`, the exp
    included) is written true or false (null where the key may be null, or an
    interpolation)."""
    for group, choice in runtime.choices.items():
        if choice is not None and not group.startswith("hydra"):
            for path in group_files(group, choice, runtime.config_sources):
                check_bool_file(path, group)


def check_bool_file(path, group: str) -> None:
    """`check_bool_files` for one yaml of `group` ("" for a stage's own config)."""
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    package = _package(path)
    prefix = (group.replace("/", ".") if package in (None, "_group_") else
              "" if package == "_global_" else package.removeprefix("_global_."))
    for leaf in leaves():
        if not is_bool(leaf.type) or (prefix and not leaf.key.startswith(prefix + ".")):
            continue
        value = data
        for part in (leaf.key[len(prefix) + 1:] if prefix else leaf.key).split("."):
            value = value.get(part, ...) if isinstance(value, dict) else ...
        if value is ... or isinstance(value, bool) or (value is None and leaf.type is not bool) \
                or (isinstance(value, str) and value.startswith("${")):
            continue
        fail(leaf.key, f"{value!r} in {path} is not a boolean; give true or false"
                       + (" (or null)" if leaf.type is not bool else ""))


def find_config_file(relative: str, sources) -> Any:
    """The file `relative` in the first config source (file or package) that has it."""
    for source in sources:
        if source["schema"] == "file":
            path = Path(source["path"]) / relative
        elif source["schema"] == "pkg":
            try:
                path = importlib.resources.files(source["path"].replace("/", ".")) / relative
            except ModuleNotFoundError:
                continue
        else:
            continue
        if path.is_file():
            return path
    return None


def _package(path) -> str | None:
    """The `# @package` of a yaml's header, if any."""
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("# @package"):
            return line.split(None, 2)[2].strip()
    return None
