"""`python -m stopexp.collect`: stage 1, collect: run the LM without pruning and fill the trace bank."""


def main() -> None:
    """The command line checked, then the stage (imported only then: stopexp.runtime.entry)."""
    from stopexp.runtime.entry import launch

    launch("collect", "stopexp.stages.collect")


if __name__ == "__main__":
    main()
