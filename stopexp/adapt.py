"""`python -m stopexp.adapt`: online fine-tuning of the signal predictor from pruning feedback, under a distribution shift."""
from stopexp.runtime.entry import launch


def main() -> None:
    """The command line checked, then the stage (imported only then: stopexp.runtime.entry)."""
    launch("adapt", "stopexp.stages.adapt")


if __name__ == "__main__":
    main()
