import atexit
import importlib
import inspect
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from absl import logging as absl_logging
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import stopexp.config  # noqa: F401  (registers the structured-config schemas)
from stopexp.stages import build

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# evaluate.load copies every module it loads into HF_MODULES_CACHE (read when evaluate is
# first imported): the tests' copies go to a directory of their own, not the user's cache
_MODULES = tempfile.mkdtemp(prefix="stopexp-hf-modules-")
os.environ["HF_MODULES_CACHE"] = _MODULES
atexit.register(shutil.rmtree, _MODULES, ignore_errors=True)
# rouge_score's absl logging (imported by test modules at collection) writes to the stderr
# of its import, a capture of pytest's, and closes it when Hydra shuts logging down after an
# in-process stage (run_stage); the interpreter's own stderr it never closes (as
# stopexp.metrics.text_similarity.rouge_scorer sets it for a run)
absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__
torch.set_num_threads(1)  # tiny models gain nothing from more, and a shared CI box suffers

# The tolerance for one float32 quantity computed by two code paths over the same model
# (decode with a KV cache vs a plain forward, a batch vs one row, decode-time taps vs the
# teacher-forced forward), which sum the same terms in other orders, with kernels that
# differ by CPU. A reduction of d terms then differs by at most ~d * 2**-24 * sum|term|;
# the test models have width 32, MLP width 64 and 2 layers, with activations and log-probs
# of magnitude <= ~10, so one layer differs by <= ~4e-6 and the model by <= ~1e-5. Anything computed from such quantities by a comparison (a ranking, a kept
# set, an AUROC) is not compared within a tolerance but made exact: see
# tests/test_adapt_stream.py::test_replay_equals_online.
FP32_REORDER = {"atol": 2e-5, "rtol": 1e-5}


def compose(config_name: str = "pipeline", overrides=(), conf_dir: Path = CONF,
            return_hydra_config: bool = False):
    """Compose a real config (tests shrink it with overrides)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides),
                             return_hydra_config=return_hydra_config)


@pytest.fixture
def out_dir(tmp_path):
    return tmp_path / "outputs"


@pytest.fixture(scope="session")
def tiny_lm():
    """A seeded, untrained tiny Llama with the char tokenizer (fast, for engine tests)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from stopexp.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                      max_position_embeddings=128, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return LlamaForCausalLM(cfg).eval(), tok


@pytest.fixture(scope="session")
def sliding_lm(tiny_lm):
    """The tiny LM's weights as a Mistral whose layers attend over a window of 6 positions,
    shorter than the prompts and paths of the tests that use it."""
    from transformers import MistralConfig, MistralForCausalLM

    lm, tok = tiny_lm
    sliding = MistralForCausalLM(MistralConfig(**{**lm.config.to_dict(), "model_type": "mistral",
                                                  "sliding_window": 6})).eval()
    sliding.load_state_dict(lm.state_dict())
    return sliding, tok


SMALL_BANK = ["logger=none", "search.n_paths=8", "collect.prompts.train=12", "collect.prompts.val=6",
              "collect.prompts.test=6", "collect.shard_prompts=6", "collect.mc_rollouts=2",
              "search.max_batch_rows=256"]


@pytest.fixture(scope="session")
def small_bank(tmp_path_factory):
    """A small trace bank of the embedded default (toy LM) and its features under the
    default tap, made once per session; returns the overrides that compose its config."""
    from stopexp.config import validate
    from stopexp.stages.collect import collect
    from stopexp.stages.featurize import featurize

    out = tmp_path_factory.mktemp("bank") / "outputs"
    overrides = [f"paths.output_dir={out}", *SMALL_BANK]
    cfg = validate(compose("collect", overrides))
    collect(build.collection(cfg))
    featurize(build.feature_set(cfg))
    return overrides


@pytest.fixture
def copied(small_bank, tmp_path):
    """(collect config, bank dir) of a private copy of the session's small bank, safe to damage."""
    from stopexp.config import validate

    original = build.bank(validate(compose("collect", small_bank))).root
    cfg = validate(compose("collect", [*small_bank, f"paths.output_dir={tmp_path / 'out'}"]))
    root = build.bank(cfg).root
    shutil.copytree(original, root, copy_function=shutil.copy2)
    return cfg, root


@pytest.fixture
def read_only(monkeypatch):
    """make(dir): `dir` becomes read-only. By chmod where modes bind; root ignores them, so
    there os.mkdir and os.open(O_CREAT) inside `dir` (what Path.mkdir and tempfile, hence
    every stopexp writer, use) fail with EACCES, as in a read-only directory."""
    import errno
    import stat

    made = []

    def make(path):
        path = Path(path).resolve()
        if os.geteuid() != 0:
            made.append((path, path.stat().st_mode))
            path.chmod(stat.S_IRUSR | stat.S_IXUSR)
            return
        real_mkdir, real_open = os.mkdir, os.open

        def refused(p) -> bool:
            p = Path(os.fsdecode(p)).resolve()
            return p != path and p.is_relative_to(path)

        def deny(p):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(p))

        def mkdir(p, *args, **kwargs):
            return deny(p) if refused(p) else real_mkdir(p, *args, **kwargs)

        def open_(p, flags, *args, **kwargs):
            return deny(p) if flags & os.O_CREAT and refused(p) else real_open(p, flags, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", mkdir)
        monkeypatch.setattr(os, "open", open_)

    yield make
    for path, mode in made:
        path.chmod(mode)


def featurized(cfg):
    """`cfg` once the features of its bank under its tap are made (python -m stopexp.featurize)."""
    from stopexp.stages.featurize import featurize

    featurize(build.feature_set(cfg))
    return cfg


def run_stage(module: str, overrides: list[str]):
    """Run a stage's @hydra.main in this process, as `python -m stopexp.<module> ...` does
    once the command line is checked (stopexp.runtime.entry)."""
    main = importlib.import_module(f"stopexp.stages.{module}").main
    task = inspect.unwrap(main)  # the stage's own function, under @hydra.main and @user_errors
    GlobalHydra.instance().clear()
    argv, name = sys.argv, task.__module__
    sys.argv, task.__module__ = [module, *overrides], "__main__"  # conf/ found by file, as -m does
    try:
        return main()
    finally:
        sys.argv, task.__module__ = argv, name
        GlobalHydra.instance().clear()


def references_task(tokenize: str = "13a"):
    """A word-level task whose problem is its list of references (what a reward reads of a
    task)."""
    from stopexp.tasks.task import Task

    class References(Task):
        name = "references"

        @classmethod
        def from_config(cls, task_cfg):
            return cls()

        def problems(self, split, n):
            return []

        def grade(self, problem, completion):
            return False

        def answer_of(self, completion):
            return completion

        def reference(self, problem):
            return problem[0]

        def references(self, problem):
            return problem

    task = References()
    task.tokenize = tokenize
    return task

