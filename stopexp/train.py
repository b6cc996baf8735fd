"""`python -m stopexp.train`: stage 2, train: fit the signal predictor on the trace bank, the LM frozen (not loaded."""


def main() -> None:
    """The command line checked, then the stage (imported only then: stopexp.runtime.entry)."""
    from stopexp.runtime.entry import launch

    launch("train", "stopexp.stages.train")


if __name__ == "__main__":
    main()
