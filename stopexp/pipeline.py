"""The whole study on one config: make (or load) the LM, then run every stage.

    python -m stopexp.pipeline +exp=toy_contrastive
"""
from __future__ import annotations

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from stopexp.artifacts import write_json
from stopexp.config import validate

log = logging.getLogger(__name__)


@hydra.main(config_path="../conf", config_name="pipeline", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    validate(cfg)
    from stopexp.models import load_lm
    from stopexp.toy_lm import solve_report

    model, tokenizer = load_lm(cfg)
    report = solve_report(cfg, model, tokenizer)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    write_json(run_dir / "metrics.json", {"lm": report})
    log.info("run dir: %s", run_dir)
    return report


if __name__ == "__main__":
    main()
