"""Stage 1b, featurize: extract the tapped hidden states of the trace bank's paths.

    python -m stopexp.featurize +exp=toy_contrastive

A teacher-forced forward over each stored path (prompt + generated tokens) yields the
features at every position of `tap.positions` at once (`stopexp.store.features`). Changing
tap.layers, tap.pooling, tap.attention_heads or tap.positions makes new features from the
same bank; nothing is regenerated. Train and evaluate run this themselves when the
features are missing; rerunning it repairs damaged shards.
"""
from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from stopexp.runtime.artifacts import write_json
from stopexp.runtime.cli import stage_main
from stopexp.config import check_output_dirs, validate
from stopexp.store.features import featurize

log = logging.getLogger(__name__)


@stage_main("featurize")
def main(cfg: DictConfig) -> dict:
    validate(cfg)
    check_output_dirs(cfg)
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    result = featurize(cfg, list(hc.overrides.task))
    write_json(Path(hc.runtime.output_dir) / "metrics.json", {"featurize": result})
    log.info("features %s: %d paths, %d positions, %.1f MB, tap layers %s, in %.1f s",
             result["features"], result["paths"], result["positions"], result["bytes"] / 1e6,
             result["tap_layers"], result["wall_s"])
    return result


if __name__ == "__main__":
    main()
