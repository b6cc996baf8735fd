"""`python -m stopexp.pipeline`: the whole study on one config: collect -> featurize -> train -> evaluate, each stage reusing what."""
from stopexp.runtime.entry import launch


def main() -> None:
    """The command line checked, then the stage (imported only then: stopexp.runtime.entry)."""
    launch("pipeline", "stopexp.stages.pipeline")


if __name__ == "__main__":
    main()
