"""`python -m stopexp.train`: stage 2, train: fit the signal predictor on the trace bank, the LM frozen (not loaded."""
from stopexp.runtime.entry import launch


def main() -> None:
    """The command line checked, then the stage (imported only then: stopexp.runtime.entry)."""
    launch("train", "stopexp.stages.train")


if __name__ == "__main__":
    main()
