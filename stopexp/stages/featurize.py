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

from stopexp.stages import build
from stopexp.stages.cli import Stage, stage_main
from stopexp.store.features import featurize

log = logging.getLogger(__name__)


@stage_main("featurize", tracked=False)
def main(stage: Stage) -> dict:
    result = featurize(build.features(stage.cfg), stage.overrides)
    log.info("features %s: %d paths, %d positions, %.1f MB, tap layers %s, in %.1f s",
             result["features"], result["paths"], result["positions"], result["bytes"] / 1e6,
             result["tap_layers"], result["wall_s"])
    return {"featurize": result}
