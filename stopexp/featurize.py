"""`python -m stopexp.featurize`: stage 1b, featurize: extract the tapped hidden states of the trace bank's paths."""
from stopexp.runtime.entry import launch


def main() -> None:
    """The command line checked, then the stage (imported only then: stopexp.runtime.entry)."""
    launch("featurize", "stopexp.stages.featurize")


if __name__ == "__main__":
    main()
