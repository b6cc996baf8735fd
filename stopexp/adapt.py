"""`python -m stopexp.adapt`: online fine-tuning of the signal predictor from pruning feedback, under a distribution shift."""


def main() -> None:
    """The command line checked, then the stage (imported only then: stopexp.runtime.entry)."""
    from stopexp.runtime.entry import launch

    launch("adapt", "stopexp.stages.adapt")


if __name__ == "__main__":
    main()
