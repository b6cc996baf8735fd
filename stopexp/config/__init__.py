"""Structured-config schemas for every config group, registered in Hydra's ConfigStore,
and validate(). The package mirrors conf/: one module per group with its schemas and range
checks (model, task, tap, predictor: predictor/train, loss, policy, search, reward, engine,
collect, evaluate, adapt, serve, paths: paths/logger); where a group's options read different keys,
one schema per option (`options`: the mechanism); `reads` (allowed values, keys only another
group's option reads), `cross` (rules spanning groups), `root` (Config, register),
`validation` (validate, RULES) and `resolvers` (the ${stopexp_*:} resolvers conf/ uses).

The main configs extend `base_config`, so a misspelt key or a value of the wrong type in
a YAML file or on the command line fails at composition with a message naming the key.
`validate` then checks ranges and cross-field rules before any compute starts.

The package also re-exports the torch-free helpers of stopexp.core (protocol, text,
names) that config code and the stages read together with the schemas.
"""
from stopexp.config.adapt import SHIFTABLE, AdaptConfig, shifted_config
from stopexp.config.collect import CollectConfig
from stopexp.config.engine import EngineConfig
from stopexp.config.evaluate import EvaluateConfig, check_method_names
from stopexp.config.model import DEVICE, TOY_UNREAD, ModelConfig, ToyLMConfig
from stopexp.config.paths import LoggerConfig, PathsConfig, check_output_dirs
from stopexp.config.policy import PolicyConfig
from stopexp.config.loss import LossConfig
from stopexp.config.predictor import POSITION_INPUT_PREDICTORS, PredictorConfig, TrainConfig
from stopexp.config.reads import ALLOWED, READ_ONLY_BY, where_read
from stopexp.config.resolvers import model_name_of, project_root, run_id  # noqa: F401
from stopexp.config.reward import RewardConfig
from stopexp.config.root import Config, register
from stopexp.config.search import MIN_TEMPERATURE, SearchConfig
from stopexp.config.serve import ServeConfig
from stopexp.config.tap import TapConfig, TapPositionsConfig
from stopexp.config.task import TaskConfig
from stopexp.config.validation import SEED_KEYS, validate
from stopexp.core.errors import ConfigError
from stopexp.core.names import ADAPT_VARIANTS, ALWAYS_METHODS, BASELINE_METHODS, SPLITS
from stopexp.core.protocol import (SYMBOLIC_LAYERS, attention_heads, check_plan, check_values,
                                   checkpoint_tokens, derived_keep, derived_n_points,
                                   derived_retention, layer_index, resolve_layers, warmup_paths)
from stopexp.core.config_text import TEXT_KEYS, TEXT_TOKENIZERS, decode_escapes, decoded_text, stop_strings

__all__ = [
    "ADAPT_VARIANTS", "ALLOWED", "ALWAYS_METHODS", "BASELINE_METHODS", "DEVICE", "MIN_TEMPERATURE",
    "POSITION_INPUT_PREDICTORS", "READ_ONLY_BY", "SEED_KEYS", "SHIFTABLE", "SPLITS",
    "SYMBOLIC_LAYERS", "TEXT_KEYS", "TEXT_TOKENIZERS", "TOY_UNREAD",
    "AdaptConfig", "CollectConfig", "Config", "ConfigError", "EngineConfig", "EvaluateConfig",
    "LoggerConfig", "LossConfig", "ModelConfig", "PathsConfig", "PolicyConfig", "PredictorConfig",
    "RewardConfig", "SearchConfig", "ServeConfig", "TapConfig", "TapPositionsConfig", "TaskConfig", "ToyLMConfig",
    "TrainConfig",
    "attention_heads", "check_method_names", "check_output_dirs", "check_plan", "check_values",
    "checkpoint_tokens", "decode_escapes", "decoded_text", "derived_keep", "derived_n_points",
    "derived_retention", "layer_index", "model_name_of", "project_root", "register",
    "resolve_layers", "run_id", "shifted_config", "stop_strings", "validate", "warmup_paths",
    "where_read",
]
