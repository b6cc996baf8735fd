"""A command line Hydra cannot compose, reported as one line: Hydra itself reports a bad
override (a misspelt key, a wrong type, an unknown option) in lines of its own with exit
code 1, after its own argument parsing. `check_overrides` composes the overrides once as
Hydra 1.3 will (its argument parser, `compose_config`) and raises ConfigError with Hydra's
message on one line, before Hydra is handed the command line. In a multirun it composes and
validates every job of the sweep (`sweep_jobs`), so that a bad value in the last job is
refused before the first one starts. `stage_config` composes a stage's config from Python
(scripts, notebooks) with the same checks."""
from __future__ import annotations

import functools
import itertools
import re
import warnings
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

import stopexp.config  # noqa: F401  (registers the schemas the configs extend)
from stopexp.config import check_output_dirs, validate
from stopexp.config.limits import check_bool_overrides
from stopexp.config.reads import check_unread_overrides
from stopexp.config.stopping import check_moved
from stopexp.core.errors import ConfigError
from stopexp.runtime.launchers import slurm_problem

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def check_overrides(config_name: str, argv: list[str], validate_run: bool = False,
                    launch: bool = False) -> None:
    """Compose conf/<config_name>.yaml with the overrides of `argv` as Hydra 1.3 will (run
    or multirun), raising ConfigError with Hydra's message on one line (`condensed`) where
    that fails. In a multirun every job of the sweep (`sweep_jobs`) is composed and
    validated (stopexp.config.validate, `check_unread_overrides`), the error naming the job;
    `validate_run`: a run's one job too (a stage validates it itself after Hydra composed it).
    `launch`: the command runs now, from this machine: a sweep's launcher must be able to
    launch here (`slurm_problem`) and the output directories of a job run here writable.
    It uses what Hydra 1.3's `_run_hydra` uses (its argument parser, `compose_config`).
    Hydra's other commands (--help, --info, ...) and another config dir are left to Hydra."""
    args = get_args_parser().parse_args(argv)
    if (args.help or args.hydra_help or args.info or args.shell_completion or args.config_path
            or args.config_dir or args.experimental_rerun):
        return
    name, overrides = args.config_name or config_name, list(args.overrides)
    check_moved(name, overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Hydra's deprecation notices: it composes again and warns
        hydra_ = GlobalHydra.instance().hydra
        compose_as = functools.partial(hydra_.compose_config, name, from_shell=True)
        tried = overrides
        try:
            # as Hydra finds the mode: sweeps are not composed yet
            cfg = compose_as(overrides, run_mode=RunMode.MULTIRUN, validate_sweep_overrides=False)
            multirun = args.multirun or cfg.hydra.mode == RunMode.MULTIRUN
            parsed = OverridesParser.create().parse_overrides(overrides)
            ConfigLoaderImpl.validate_sweep_overrides_legal(
                parsed, RunMode.MULTIRUN if multirun else RunMode.RUN, from_shell=True)
            params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
            jobs = (sweep_jobs(params, overrides, hydra_.config_loader) if multirun else
                    [overrides] if validate_run else [])
            if args.cfg:  # Hydra prints the config and runs no job
                jobs = []
            shared = set.intersection(*map(set, jobs)) if jobs else set()
            launcher = OmegaConf.select(cfg, "hydra.launcher._target_") or ""
            here = launcher in LOCAL_LAUNCHERS
            problem = slurm_problem(launcher) if launch and multirun else None
            if problem:  # as LauncherCheck does later
                raise ConfigError(problem)
            for i, tried in enumerate(jobs):
                # a run's one job is the config composed above (the modes differ only where a
                # group's default is missing, which a sweeper may fill)
                job = compose_as(tried, run_mode=RunMode.RUN) if multirun else cfg
                hc = job.hydra
                with open_dict(job):  # as Hydra hands a job its config (validate is faster so)
                    del job["hydra"]
                try:
                    check_bool_overrides(job, hc.overrides.task)
                    validate(job, hc.runtime, machine=here)
                    check_unread_overrides(job, hc.overrides.task)
                    if launch and here:  # as the stage does later
                        check_output_dirs(job)
                except ConfigError as e:
                    if not multirun:
                        raise
                    swept = " ".join(o for o in tried if o not in shared)
                    raise ConfigError(f"{e} (sweep job {i + 1} of {len(jobs)}"
                                      f"{': ' + swept if swept else ''})") from None
        except (HydraException, OmegaConfBaseException) as e:
            raise ConfigError(condensed(e)) from e
        except AssertionError as e:  # OmegaConf's update of a key inside a null node
            inside = inside_null(hydra_, name, tried)
            if inside is None:
                raise
            raise ConfigError(inside) from e
        except ValueError as e:  # Hydra's check of a group set to null (`model=null`)
            if isinstance(e, ConfigError) or not str(e).startswith("Config group override must be"):
                raise
            null = next(o for o in OverridesParser.create().parse_overrides(tried) if o.value() is None)
            group = null.key_or_group
            raise ConfigError(f"{null.input_line}: {group} is a config group; give one of its "
                              "options") from e


def stage_config(stage: str, overrides=()):
    """conf/<stage>.yaml (a stage built on conf/common.yaml) composed with Hydra `overrides`
    (command-line syntax) and validated as the stage's command line composes one job;
    without a tracker (logger=none) unless an override sets the logger. A bad override, a
    sweep or a flag raises ConfigError on one line before anything runs. A Hydra that the
    caller initialised (a notebook's `initialize`, a Hydra app) is set aside for the call."""
    overrides, stages = list(overrides), common_stages()
    if stage not in stages:
        raise ConfigError(f"stage: {stage!r}; stage_config composes {', '.join(stages)}")
    for o in overrides:
        if o.startswith("-"):
            raise ConfigError(f"{o}: a command-line flag; stage_config takes overrides (key=value)")
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise ConfigError(condensed(e)) from None
    for o in parsed:
        if o.is_sweep_override():
            raise ConfigError(f"{o.input_line}: a sweep; stage_config composes one job (one value; "
                              "a sweep runs from the command line with -m)")
    if not any(o.key_or_group.split(".")[0] == "logger" for o in parsed):
        overrides.insert(0, "logger=none")
    gh = GlobalHydra.instance()
    aside = gh.hydra if gh.is_initialized() else None
    gh.clear()
    try:
        check_overrides(stage, overrides, validate_run=True)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return validate(compose(stage, overrides))
    finally:
        if aside is not None:
            GlobalHydra.instance().initialize(aside)


def common_stages() -> list[str]:
    """The configs of conf/ built on common.yaml: the stages whose config is `Config`."""
    return sorted(p.stem for p in CONF_DIR.glob("*.yaml")
                  if "common" in (OmegaConf.load(p).get("defaults") or []))


# launchers whose jobs run on this machine; any other (submitit's SLURM) runs them elsewhere,
# where each job checks its machine itself
LOCAL_LAUNCHERS = ("hydra._internal.core_plugins.basic_launcher.BasicLauncher",
                   "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher")


def sweep_jobs(params, overrides: list[str], config_loader) -> list[list[str]]:
    """The override list of every job of the sweep, as Hydra's basic sweeper makes them
    (`BasicSweeper.split_arguments`: the product of every swept key's values, a key set twice
    taking its last setting), from the sweeper's `params` (hydra.sweeper.params: basic and
    optuna read them, the command line's settings after them) and the command line. Choice,
    range and glob sweeps give each of their values; an interval (optuna's search space) its
    two ends."""
    lines = [f"{k}={v}" for k, v in params.items() if v is not None] + overrides
    values: dict[str, list[str]] = {}
    for o in OverridesParser.create(config_loader=config_loader).parse_overrides(lines):
        key = o.get_key_element()
        if o.is_discrete_sweep():
            values[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        elif o.is_interval_sweep():
            ends = o.value()
            values[key] = [f"{key}={v}" for v in dict.fromkeys((ends.start, ends.end))]
        else:
            values[key] = [o.input_line]
    return [list(job) for job in itertools.product(*values.values())]


def inside_null(hydra_, config_name: str, overrides: list[str]) -> str | None:
    """The message for the first override that sets a key inside a node that is null under
    the chosen options (`model.toy.hidden_size=8` under model=smollm2), naming the options
    of its group that fill that node; None if there is no such override."""
    repo = hydra_.config_loader.repository
    parsed = OverridesParser.create().parse_overrides(overrides)
    groups = [o.input_line for o in parsed if repo.group_exists(o.key_or_group)]
    cfg = hydra_.compose_config(config_name, groups, run_mode=RunMode.MULTIRUN,
                                validate_sweep_overrides=False)
    for o in parsed:
        parts = o.key_or_group.split(".")
        nulls = [".".join(parts[:i]) for i in range(1, len(parts))
                 if OmegaConf.select(cfg, ".".join(parts[:i])) is None]
        if o.input_line in groups or not nulls:
            continue
        node, group = nulls[0], parts[0]
        chosen = cfg.hydra.runtime.choices.get(group)
        inner = node.partition(".")[2]
        readers = [opt for opt in repo.get_group_options(group) if opt != chosen and
                   OmegaConf.select(repo.load_config(f"{group}/{opt}").config, inner) is not None]
        if chosen is not None and readers:
            return (f"{o.key_or_group}: {node} is read only by {group}={'|'.join(readers)}, not "
                    f"under {group}={chosen} (null there); drop {o.input_line}")
        return (f"{o.key_or_group}: {node} is null, so nothing inside it can be set; set {node} "
                f"itself (e.g. {node}=[...])")
    return None


def condensed(e: Exception) -> str:
    """Hydra's report of a composition error on one line: its own lines (a missing option's
    listing as one list, without the config search path), after the key and message of the
    OmegaConf error that caused it."""
    text = str(e).split("Config search path:")[0]
    parts: list[str] = []
    for line in filter(None, map(str.strip, text.splitlines())):
        if set(line) == {"^"}:  # the caret under a parse error's position
            continue
        if parts and parts[-1].endswith((":", ",")):  # an option of "Available options in 'x':"
            if not line.endswith("_schema"):  # the schemas registered by stopexp.config
                parts[-1] += f" {line},"
        else:
            parts.append(line)
    hydra_text = "; ".join(p.rstrip(",.") for p in parts)
    # Hydra's advice to append a misspelt key would add it silently where the section is open
    hydra_text = re.sub(r"; To append to your config use \+\S+", "; check the key's spelling", hydra_text)
    if hydra_text.startswith("In ") and "Could not find '" in hydra_text:  # an option's yaml
        hydra_text += ("; an option's yaml outside conf/ is found with "
                       "hydra.searchpath=[file:///path/to/its/conf]")
    if getattr(e, "override", None):  # a parse error: name the override
        hydra_text = f"{e.override}: {hydra_text}"
    cause = e.__cause__
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:
        first = str(cause.msg).splitlines()[0]  # the lines after it repeat the key and types
        return f"{cause.full_key}: {first} ({hydra_text})" if hydra_text else f"{cause.full_key}: {first}"
    return hydra_text or str(cause)
