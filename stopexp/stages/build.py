"""What a stage builds from the whole config in its first lines, one small function per
object, so that nothing below the stages takes the whole config: each reads the sections
it needs and hands the library one object or a few plain values."""
from __future__ import annotations

from omegaconf import OmegaConf

from stopexp.runtime.tracking import tracked_run


def tracked(cfg, job_type: str, name: str | None = None):
    """The tracked run of a stage (`stopexp.runtime.tracking.tracked_run`): its logger, its
    output directory and the resolved config as the run records it."""
    return tracked_run(cfg.logger, cfg.paths.output_dir, OmegaConf.to_container(cfg, resolve=True),
                       job_type, name)
