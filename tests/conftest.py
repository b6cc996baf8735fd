import os
from pathlib import Path

import pytest
import torch
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import stopexp.config  # noqa: F401  (registers the structured-config schemas)

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)  # tiny models gain nothing from more, and a shared CI box suffers


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


SMALL_BANK = ["logger=none", "search.n_paths=8", "collect.prompts.train=12", "collect.prompts.val=6",
              "collect.prompts.test=6", "collect.shard_prompts=6", "collect.mc_rollouts=2",
              "search.max_batch_rows=256"]


@pytest.fixture(scope="session")
def small_bank(tmp_path_factory):
    """A small trace bank of the embedded default (toy LM), collected once per session;
    returns the overrides that compose its config."""
    from stopexp.collect import collect
    from stopexp.config import validate

    out = tmp_path_factory.mktemp("bank") / "outputs"
    overrides = [f"paths.output_dir={out}", *SMALL_BANK]
    collect(validate(compose("collect", overrides)))
    return overrides
