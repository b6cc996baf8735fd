"""The names config checks and the layers above share, kept here so that checking a name
needs no torch import: the registry of implementations by kind and name (tasks,
predictors, losses, policies, rewards, evaluate's methods: "module:attr", imported on
lookup), shipped benchmarks, splits, signals, adapt variants; and the two registries a user plugs
into (external scorers for evaluate.methods, external rewards for reward.function),
defined here and re-exported where they are used (stopexp.signals.methods,
stopexp.tasks.rewards)."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
from pathlib import Path
from typing import Any, Callable

from stopexp.core.errors import ConfigError, error_text

# kind -> name -> "module:attr": what each name is, imported on `lookup` only, so that a
# name is checked (stopexp.config) without importing its module (torch, for most)
REGISTRY: dict[str, dict[str, str]] = {
    # what generates the paths: stopexp.engines.Backend
    "engine": {"hf": "stopexp.engines.hf:HF", "vllm": "stopexp.engines.vllm:VLLM"},
    "task": {"arith": "stopexp.tasks.arith:ArithTask", "qa": "stopexp.tasks.qa:QATask",
             "wordprob": "stopexp.tasks.wordprob:WordProblemTask",
             "datatotext": "stopexp.tasks.datatotext:DataToTextTask",
             "mixture": "stopexp.tasks.mixture:MixtureTask"},
    # predictors of a feature batch: cls(predictor config, FeatureSpec) (stopexp.signals)
    "predictor": {"statistic": "stopexp.signals.statistic:StatisticPredictor",
                  "linear": "stopexp.signals.linear:LinearPredictor",
                  "mlp": "stopexp.signals.mlp:MLPPredictor",
                  "fusion": "stopexp.signals.fusion:FusionPredictor",
                  "conf_features": "stopexp.signals.conf_features:ConfFeaturesPredictor",
                  "hidden_conf": "stopexp.signals.hidden_conf:HiddenConfPredictor"},
    # predictors that run the LM on the prefix (stopexp.models.super_token)
    "lm_predictor": {"super_token": "stopexp.models.super_token:SuperTokenPredictor"},
    "loss": {"contrastive": "stopexp.training.losses:contrastive",
             "pairwise": "stopexp.training.losses:pairwise",
             "reward_regression": "stopexp.training.losses:reward_regression",
             "mse": "stopexp.training.losses:mse"},
    "policy": {"fixed": "stopexp.core.policies:FixedThreshold",
               "quantile": "stopexp.core.policies:Quantile", "topk": "stopexp.core.policies:TopK",
               "adaptive": "stopexp.core.policies:Adaptive",
               "risk": "stopexp.core.policies:RiskControlled"},
    "reward": {name: "stopexp.tasks.rewards:Reward" for name in (
        "correct", "rouge_l", "bleu", "bertscore", "neg_perplexity", "external", "evaluate")},
    # evaluate.methods that score a path at a check, batch -> (B,) (stopexp.signals.methods):
    # the non-learnable baselines, and the controls (random: a factory of evaluate.seed)
    "baseline": {name: f"stopexp.signals.methods:{name}" for name in (
        "confidence", "min_logprob", "entropy", "deepconf", "hidden_norm", "hidden_mean",
        "hidden_var", "attn_entropy", "st_bon")},
    "control": {"random": "stopexp.signals.methods:random_scorer",
                "oracle": "stopexp.signals.methods:oracle",
                "error_oracle": "stopexp.signals.methods:error_oracle"},
    # the stopping methods, each a dataclass of its settings that replays on a trace bank
    # (evaluate.methods) and/or an answers-only bank (answers_replay): stopexp.stopping.method
    "stopping": {"esc": "stopexp.stopping.esc:ESC",
                 "adaptive_consistency": "stopexp.stopping.adaptive_consistency:AdaptiveConsistency",
                 "deepconf_online": "stopexp.stopping.deepconf:DeepConfOnline",
                 "deepconf_weighted": "stopexp.stopping.deepconf:DeepConfWeighted",
                 "deepconf_top": "stopexp.stopping.deepconf:DeepConfTop",
                 "parallel_probe": "stopexp.stopping.parallel_probe:ParallelProbe",
                 "combined": "stopexp.stopping.combined:Combined",
                 "step": "stopexp.stopping.step:Step"},
    # the engine-side protocol of a stopping method whose module needs torch (the method's
    # `controller` looks it up, so that the config reads the method's settings without torch)
    "stopping_online": {"step": "stopexp.stopping.step_online:OnlineStep"},
}


def installed_plugins() -> dict[str, dict[str, str]]:
    """What installed packages register, from their entry points: group `stopexp.<kind>`,
    one entry `name = "module:attr"` per implementation, e.g. in a pyproject.toml

        [project.entry-points."stopexp.predictor"]
        my_probe = "my_package.probe:MyProbe"

    Read from the packages' metadata, nothing imported (the modules load on `lookup`),
    so every process finds them: a stage started by `python -m`, a sweep's workers."""
    from importlib.metadata import entry_points

    found: dict[str, dict[str, str]] = {}
    for group in entry_points().groups:
        if group.startswith("stopexp."):
            for ep in entry_points(group=group):
                found.setdefault(group.removeprefix("stopexp."), {})[ep.name] = ep.value
    return found


# what an installed plugin could not take: (kind, name, its entry point's target, why)
CONFLICTS: list[tuple[str, str, str, str]] = []


def _add_installed() -> None:
    built_in = {kind: dict(entries) for kind, entries in REGISTRY.items()}
    for kind, entries in installed_plugins().items():
        for name, target in entries.items():
            taken = REGISTRY.setdefault(kind, {}).get(name)
            if taken is None:
                REGISTRY[kind][name] = target
            elif name in built_in.get(kind, {}):  # a built-in name stays built in
                CONFLICTS.append((kind, name, target, f"shadows the built-in {taken!r}"))
            elif taken != target:
                CONFLICTS.append((kind, name, target, f"is also installed as {taken!r}"))


def check_plugins() -> None:
    """ConfigError naming an installed plugin that takes a name already taken (a built-in's,
    or another installed package's): it would be silently lost. Run where a stage starts."""
    if CONFLICTS:
        kind, name, target, why = CONFLICTS[0]
        raise ConfigError(f"entry point stopexp.{kind} {name} = {target!r} {why}; rename it in "
                          "its package's entry points (the names of a kind: "
                          "stopexp.core.names.names(kind))")


_add_installed()


def register(kind: str, name: str, target: str, replace: bool = False) -> None:
    """Register `target` ("module:attr") as the `kind` named `name` (where it is defined).
    A name taken by another target is refused (ConfigError) unless `replace=True` (tests);
    registering the same target again (a notebook's cell run twice) changes nothing."""
    taken = REGISTRY.get(kind, {}).get(name)
    if taken is not None and taken != target and not replace:
        raise ConfigError(f"{kind} {name!r} is already registered as {taken!r}; register "
                          f"{target!r} under another name (or pass replace=True to replace it)")
    REGISTRY.setdefault(kind, {})[name] = target


def names(kind: str) -> tuple[str, ...]:
    return tuple(REGISTRY.get(kind, ()))


def lookup(kind: str, name: str) -> Any:
    """The `kind` named `name`, its module imported now; ValueError naming what is allowed."""
    if name not in REGISTRY.get(kind, {}):
        raise ValueError(f"{kind}.name: {name!r} unknown; allowed: {', '.join(names(kind))}")
    target = REGISTRY[kind][name]
    module, _, attr = target.partition(":")
    if module.split(".")[0] == "stopexp":  # the package's own: a failure is a bug or a missing extra
        return getattr(importlib.import_module(module), attr)
    # registered by another package or a script: its failure is the user's to fix
    return import_target(module, attr, f"{kind}.name: {name!r} (registered as {target!r})",
                         f"install the package that registers it (its entry point in group "
                         f"stopexp.{kind}) or fix the target")


def import_target(module: str, attr: str, what: str, todo: str) -> Any:
    """`attr` of `module` imported now, where `module` is a user's (a plugin's, a reward's):
    ConfigError "<what> cannot be imported (...); <todo>" when the module or the
    attribute is not there, and "<what>: importing <module> (<file>) raised <exception>"
    when the module's own code fails (a syntax error, a raise at import)."""
    try:
        loaded = import_current(module)
    except Exception as e:  # noqa: BLE001  (the module's own code may raise anything)
        not_there = isinstance(e, ImportError) and f"{module}.".startswith(f"{e.name}.")
        if not_there or not module:  # no such module, or none named (ValueError)
            raise ConfigError(f"{what} cannot be imported ({error_text(e)}); {todo}") from None
        raise ConfigError(f"{what}: importing {module} ({module_file(module)}) raised "
                          f"{error_text(e)}; fix the module (STOPEXP_DEBUG=1 shows the "
                          "traceback)") from e
    try:
        return getattr(loaded, attr)
    except AttributeError as e:
        raise ConfigError(f"{what} cannot be imported ({error_text(e)}); {todo}") from None


SPLITS = ("train", "val", "test")
# the benchmarks shipped in stopexp/tasks/data/, which task.path may name (stopexp.tasks.benchmarks)
BENCHMARKS = ("gsm8k", "math500", "aime24", "aime25", "hmmt25", "amc23")


def predictor_names() -> tuple[str, ...]:
    """Every registered predictor, those registered after import included."""
    return (*names("predictor"), *names("lm_predictor"))


def runs_the_lm(predictor: str) -> bool:
    """Whether the predictor runs the LM on the prefix (kind lm_predictor: super_token)
    rather than reading stored features."""
    return predictor in REGISTRY.get("lm_predictor", {})


# the signal columns of a feature batch, in order (stopexp.signals.columns computes them)
SIGNAL_NAMES = ("mean_logprob", "min_logprob", "mean_entropy", "group_conf", "hidden_norm",
                "hidden_mean", "hidden_var", "attn_entropy", "prefix_len")
# the methods evaluate always runs (evaluate.ALWAYS) and the non-learnable baselines
# (stopexp.signals.methods.NON_LEARNABLE)
def method_name(name: str, predictor: str) -> str:
    """A method of evaluate.methods by its own name: `learned` is the configured predictor."""
    return predictor if name == "learned" else name


ALWAYS_METHODS = ("no_prune", "random", "confidence", "oracle")
# the controls that read what no check knows while generating: the path's outcome (oracle)
# and whether a wrong intermediate value is written by the prefix (error_oracle)
ORACLE_METHODS = ("oracle", "error_oracle")
BASELINE_METHODS = names("baseline")
ADAPT_VARIANTS = ("no_prune", "frozen", "kept_only", "explore", "mc_feedback", "retrained")
ONLINE_VARIANTS = ("kept_only", "explore", "mc_feedback")  # the variants that learn from the stream
# the rewards validate lets the regression losses (mse, reward_regression) use: the
# built-in ones in [0, 1], and external and evaluate, whose range only their values tell
# (stopexp.tasks.rewards)
BOUNDED_REWARDS = ("correct", "rouge_l", "bleu", "bertscore", "external", "evaluate")

Scorer = Callable[[dict], Any]  # batch -> (B,) scores, higher = keep (stopexp.signals.methods)
_EXTERNAL: dict[str, Scorer] = {}
_REGISTERED: dict[str, Callable] = {}


def register_external(name: str, scorer: Scorer) -> None:
    """Plug a scorer in (a verifier, a process reward model, ...); evaluate.methods can
    then name it."""
    _EXTERNAL[name] = scorer


def external(name: str) -> Scorer | None:
    return _EXTERNAL.get(name)


def register_reward(name: str, fn: Callable) -> None:
    """Plug a reward in: fn(problem, text) -> float (e.g. an evaluator model's score);
    reward=external reward.function=NAME then uses it. It must lie in [0, 1] for the
    regression losses."""
    _REGISTERED[name] = fn


def resolve_external(name: str) -> Callable:
    """The registered reward `name`, or the function at `module:function`; ValueError
    saying what is allowed otherwise."""
    if name in _REGISTERED:
        return _takes_problem_and_text(name, _REGISTERED[name])
    module, _, attr = name.partition(":")
    if attr:
        fn = import_target(module, attr, repr(name), "give module:function, e.g. mypkg.rewards:score")
        if not callable(fn):
            raise ValueError(f"{name!r} is a {type(fn).__name__}, not a function "
                             "fn(problem, text) -> float")
        return _takes_problem_and_text(name, fn)
    raise ValueError(f"{name!r} is neither registered (registered: {sorted(_REGISTERED) or 'none'}) "
                     "nor an importable module:function")


def module_file(name: str) -> str:
    """The file that module `name` is imported from, as far as finding it tells."""
    try:
        spec = importlib.util.find_spec(name)
    except Exception:  # noqa: BLE001  (a parent package that fails to import)
        spec = None
    return str(spec.origin) if spec is not None and spec.origin else "file unknown"


_SOURCES: dict[str, bytes] = {}  # module name -> the digest of the source it was loaded from


def import_current(name: str):
    """The module `name` as its source file reads now: imported, or reloaded where the file
    changed since this process loaded it (a reward edited during a notebook's session)."""
    module = importlib.import_module(name)
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py") or not Path(path).is_file():
        return module
    digest = hashlib.sha256(Path(path).read_bytes()).digest()
    if _SOURCES.get(name, digest) != digest:
        # its bytecode cache is valid by the source's mtime in seconds and size: a quick
        # edit of the same length would be read from it
        cached = getattr(module, "__cached__", None)
        if cached:
            Path(cached).unlink(missing_ok=True)
        module = importlib.reload(module)
    _SOURCES[name] = digest
    return module


def _takes_problem_and_text(name: str, fn: Callable) -> Callable:
    """`fn` if it can be called as fn(problem, text) (as far as its signature tells: some
    builtins have none), else ValueError naming reward.function's value."""
    import inspect

    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn
    try:
        signature.bind(None, "")
    except TypeError as e:
        raise ValueError(f"{name!r} cannot be called as fn(problem, text) -> float: its "
                         f"signature is {signature} ({e})") from None
    return fn
