"""What `python -m stopexp.<stage>` runs: the command line checked before the stage is
imported. A stage imports torch, transformers and its engines (about 8 s on 2 cores); the
config needs none of them, so a bad override or value is one `error:` line within a
second (stopexp.runtime.overrides.check_overrides: the run's one job validated too, the
launcher and the output directories checked), and
then the stage's entry point (stopexp.stages.cli.stage_main) runs without checking again."""
from __future__ import annotations

import importlib
import sys

from stopexp.core.errors import reported
from stopexp.core.names import check_plugins
from stopexp.runtime.overrides import check_overrides


def launch(config_name: str, module: str) -> None:
    """Check the command line for conf/<config_name>.yaml, then run `module`'s `main`."""
    with reported():
        check_plugins()  # an installed plugin that takes a taken name
        check_overrides(config_name, sys.argv[1:], validate_run=True, launch=True)
    importlib.import_module(module).main(checked=True)
