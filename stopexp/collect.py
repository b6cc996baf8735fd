"""`python -m stopexp.collect`: stage 1, collect: run the LM without pruning and fill the trace bank."""
from stopexp.runtime.entry import launch


def main() -> None:
    """The command line checked, then the stage (imported only then: stopexp.runtime.entry)."""
    launch("collect", "stopexp.stages.collect")


if __name__ == "__main__":
    main()
