"""Groups whose options read different keys: one schema (a dataclass) per option, which the
option's yaml extends (`defaults: [<option>_schema, _self_]`), and the group's view: a
dataclass that inherits every option's schema, i.e. every option's keys at their defaults.

A composed config holds the view, typed as the chosen option's schema: the section's keys
and values, which the artifact keys hash (stopexp.store.keys), are every option's keys,
the chosen option's as set and the others' at their defaults, and code reading a key of
another option finds its default.
Hydra merges the option's yaml into that section, so a key of no option (a typo) fails in
that file at composition, but a key of another option composes: validate refuses it in an
option's yaml whatever its value, naming the file (stopexp.config.option_files), and
anywhere else off its default, naming the options that read it
(stopexp.config.reads.check_unread).

A schema checks itself beside its fields: `ranges(node)`, the values its keys may take, is
run for every option of the group (a bad value is named as such, whichever option is
chosen), `needs(node)`, what the option requires, for the chosen one only (`Group.check`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from stopexp.core.errors import fail


def by_name(node) -> str:
    return node.name


@dataclass(frozen=True)
class Group:
    name: str                    # the config group: conf/<name>/, cfg.<name>
    options: dict[str, type]     # option -> its schema, in the order messages list them
    view: type                   # every option's keys: a dataclass inheriting every schema
    chosen: Callable[[Any], str] = by_name  # the option a section is of
    # refused off their default where the chosen option lacks them (reads.check_unread);
    # False where the group's own checks name the options in their own words (model)
    refuse_unread: bool = True
    # the schema of an option registered without one of its own (from another package): it
    # reads the base's keys and those its yaml adds beyond the view; None: every option has
    # a schema
    base: type | None = None
    # with `base`: the registered names an option may take (stopexp.core.names), read when
    # checked so that names registered after import count
    registered: Callable[[], tuple[str, ...]] | None = None

    def __post_init__(self):
        missing = [o for o, schema in self.options.items() if not issubclass(self.view, schema)]
        if missing:
            raise TypeError(f"{self.view.__name__} must inherit the schemas of {missing}")

    def keys(self, option: str) -> tuple[str, ...]:
        schema = self.options[option] if option in self.options or self.base is None else self.base
        return tuple(f.name for f in dataclasses.fields(schema))

    def view_keys(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.view))

    def readers(self, key: str) -> list[str]:
        """The options whose schema has `key` (a key of the section, without the group)."""
        return [o for o in self.options if key in self.keys(o)]

    def check(self, node) -> None:
        """A registered option (where the group takes options without a schema), every
        schema's `ranges` (once per class, base classes first), then the chosen option's
        `needs`."""
        if self.registered is not None and self.chosen(node) not in self.registered():
            fail(f"{self.name}.name", f"{self.chosen(node)!r} is not allowed; allowed: "
                                      f"{', '.join(self.registered())}")
        for cls in reversed(self.view.__mro__):
            if "ranges" in cls.__dict__:
                cls.ranges(node)
        schema = self.options.get(self.chosen(node))
        if schema is not None and "needs" in schema.__dict__:
            schema.needs(node)


def filled(view: type) -> DictConfig:
    """The view's defaults as a section that any option's schema merges into: typed by the
    view's fields, but of no structured type itself, since OmegaConf merges a structured
    config only into one of its own class or a base class (the merged section then takes
    the option's schema as its type)."""
    node = OmegaConf.structured(view)
    node._metadata.object_type = dict  # no public setter; it is what OmegaConf.create(dict) sets
    return node


def section(view: type) -> Any:
    """A root Config field holding a group's view (`filled`); its metadata names the view
    for whoever walks the schema."""
    return dataclasses.field(default_factory=lambda: filled(view), metadata={"view": view})


def view_of(schema: type, groups) -> type:
    """The view of the group that `schema` (a section's type) is an option or the view of;
    `schema` itself otherwise."""
    for g in groups:
        if schema is g.view or schema in g.options.values():
            return g.view
    return schema
