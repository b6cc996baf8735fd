"""The rules over every key of a kind, read from the schemas (`leaves`: every key of a root
schema with its type and its field metadata, stopexp.core.limits):

- `check_whole`: a key that holds counts (an int-typed one, or one declared with `count`)
  holds whole numbers; a count-or-share (`count(share=True)`) a whole number at 1 and
  above. OmegaConf refuses a fraction for an int-typed key as it merges; a float- or
  Any-typed key that holds counts (train.checkpoint, search.check_at, policy.keep) would
  take it, and the code reading it would truncate it.
- `check_bounds`: a key declared with `count(bound=...)` and set is at most its bound
  where the config tells it (`bounds_of`: N, max_new_tokens, the LM's vocabulary and width read
  from the config or the model's files, the bank's prompts).
- `check_bool_overrides`: a bool key set on the command line is given true or false
  (OmegaConf would take 2 or "yes" as true).
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from stopexp.config.answers_replay import AnswersReplayConfig
from stopexp.config.machine import model_shape
from stopexp.config.ranges import fail, get, is_list
from stopexp.config.reads import is_set
from stopexp.config.root import Config


@dataclass(frozen=True)
class Leaf:
    key: str
    type: Any
    count: str | None   # "whole" | "share" (a count at 1 and above, a share below) | None
    bound: str | None   # stopexp.core.limits.BOUNDS
    below: bool = False  # less than the bound, not at most it


def _bare(t: Any) -> Any:
    """Optional[X] -> X."""
    args = [a for a in typing.get_args(t) if a is not type(None)]
    return args[0] if typing.get_origin(t) is typing.Union and len(args) == 1 else t


def _holds_ints(t: Any) -> bool:
    """int, or a list or dict of ints (Optional or not)."""
    t = _bare(t)
    if t is int:
        return True
    origin, args = typing.get_origin(t), typing.get_args(t)
    return origin in (list, dict) and bool(args) and args[-1] is int


def is_bool(t: Any) -> bool:
    return _bare(t) is bool


def _section(field: dataclasses.Field, t: Any) -> type | None:
    """The dataclass a field holds (a group's view, a nested section), None for a leaf."""
    t = _bare(t)
    return field.metadata.get("view") or (t if dataclasses.is_dataclass(t) else None)


@functools.lru_cache(maxsize=None)
def leaves(root: type = Config, prefix: str = "") -> tuple[Leaf, ...]:
    """Every key of `root` (sections walked, a group's view holding every option's keys)."""
    hints = typing.get_type_hints(root)
    out: list[Leaf] = []
    for f in dataclasses.fields(root):
        t = hints[f.name]
        sub = _section(f, t)
        if sub is not None:
            out += leaves(sub, f"{prefix}{f.name}.")
            continue
        count = f.metadata.get("count") or ("whole" if _holds_ints(t) else None)
        out.append(Leaf(f"{prefix}{f.name}", t, count, f.metadata.get("bound"),
                        f.metadata.get("below", False)))
    return tuple(out)


def _values(value: Any) -> list:
    """A key's value as the list of its numbers: a list's or dict's entries, or itself."""
    if value is None:
        return []
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return list(value.values())
    return list(value) if is_list(value) else [value]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


BOUND_OF = {"n_paths": "search.n_paths", "max_new_tokens": "search.max_new_tokens"}


def check_whole(cfg: DictConfig, root: type = Config) -> None:
    """Every count of `cfg` is whole (a count-or-share: whole at 1 and above)."""
    for leaf in leaves(root):
        if leaf.count is None:
            continue
        for v in _values(get(cfg, leaf.key)):
            if leaf.count == "whole" and not (_number(v) and v == int(v)):
                fail(leaf.key, f"{v!r} is not a whole number; give an integer")
            if leaf.count == "share" and not (_number(v) and (v < 1 or v == int(v))):
                of = f" of {BOUND_OF[leaf.bound]}" if leaf.bound in BOUND_OF else ""
                fail(leaf.key, f"{v!r} is neither a share in (0, 1){of} nor a whole count; give "
                               "one of them")


def bounds_of(cfg) -> dict[str, tuple[int, str]]:
    """What the counts of `cfg` may not exceed, where the config tells it: bound -> (the
    limit, how a message names it)."""
    s, prompts, m = cfg.search, cfg.collect.prompts, cfg.model
    out = {"n_paths": (s.n_paths, f"the {s.n_paths} paths of a prompt (search.n_paths)"),
           "max_new_tokens": (s.max_new_tokens, f"the {s.max_new_tokens} tokens of a path "
                                                "(search.max_new_tokens)")}
    train = prompts.get("train", 0)
    out["train_prompts"] = (train, f"the {train} train prompts the trace bank is collected "
                                   "with (collect.prompts.train)")
    split = cfg.evaluate.split
    out["split_prompts"] = (prompts.get(split, 0), f"the {prompts.get(split, 0)} {split} prompts "
                                                   f"of the trace bank (collect.prompts.{split})")
    shape = model_shape(m, cfg.task.name)
    width = m.toy.hidden_size if m.toy is not None else m.hidden_size
    where = "model.toy.hidden_size" if m.toy is not None else "model.hidden_size"
    if width is None and shape is not None and shape.hidden is not None:
        width, where = shape.hidden, shape.source
    if width is not None:
        out["width"] = (width, f"the {width}-wide hidden state of model {m.name!r} ({where})")
    if cfg.engine.name == "vllm" and cfg.engine.max_model_len is not None:
        out["positions"] = (cfg.engine.max_model_len, f"the {cfg.engine.max_model_len} positions "
                                                      "of a sequence (engine.max_model_len)")
    elif shape is not None and shape.positions is not None:
        out["positions"] = (shape.positions, f"the {shape.positions} positions of model "
                                             f"{m.name!r} ({shape.source})")
    if shape is not None and shape.vocab is not None:
        out["vocab"] = (shape.vocab, f"the {shape.vocab} tokens of the vocabulary of model {m.name!r} "
                                     f"({shape.source})")
    return out


def check_bounds(cfg) -> None:
    """Every count declared with a bound and set off its default is within it (a share
    below 1 is). A default is left alone: it is no one's choice, and a run shrunk to a few
    paths (search.n_paths=4 under ESC's window of 8) runs with no other edit."""
    known = bounds_of(cfg)
    for leaf in leaves(Config):
        if leaf.bound not in known or not is_set(cfg, leaf.key):
            continue
        limit, what = known[leaf.bound]
        most = limit - 1 if leaf.below else limit
        for v in _values(get(cfg, leaf.key)):
            if _number(v) and v >= 1 and v > most:
                v = int(v) if v == int(v) else v  # a count given as a float (64.0) reads as 64
                fail(leaf.key, f"{v} {'reaches' if v == limit else 'exceeds'} {what}; give at "
                               f"most {most}")


def check_bool_overrides(cfg, overrides) -> None:
    """Every bool key that `overrides` (Hydra's task overrides of `cfg`) set is given true
    or false (null where the key may be null; an interpolation is resolved as it is read)."""
    root = AnswersReplayConfig if cfg.stage == "answers_replay" else Config
    if OmegaConf.is_config(overrides):
        overrides = OmegaConf.to_container(overrides, resolve=False)
    types = {leaf.key: leaf.type for leaf in leaves(root) if is_bool(leaf.type)}
    for o in OverridesParser.create().parse_overrides(list(overrides)):
        key = o.key_or_group
        if key not in types or o.is_sweep_override() or o.is_delete():
            continue
        value = o.value()
        nullable = types[key] is not bool
        if isinstance(value, bool) or (value is None and nullable) or (
                isinstance(value, str) and value.startswith("${")):
            continue
        fail(key, f"{value!r} is not a boolean; give true or false{' (or null)' if nullable else ''}")
