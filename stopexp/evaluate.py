"""`python -m stopexp.evaluate`: stage 3, evaluate: prune with every method under one accounting, and show it."""
from stopexp.runtime.entry import launch


def main() -> None:
    """The command line checked, then the stage (imported only then: stopexp.runtime.entry)."""
    launch("evaluate", "stopexp.stages.evaluate")


if __name__ == "__main__":
    main()
