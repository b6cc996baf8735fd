"""`python -m stopexp.evaluate`: stage 3, evaluate: prune with every method under one accounting, and show it."""


def main() -> None:
    """The command line checked, then the stage (imported only then: stopexp.runtime.entry)."""
    from stopexp.runtime.entry import launch

    launch("evaluate", "stopexp.stages.evaluate")


if __name__ == "__main__":
    main()
