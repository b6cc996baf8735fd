"""`python -m stopexp.answers_replay`: replay stopping methods on an answers-only bank, under one accounting."""
from stopexp.runtime.entry import launch


def main() -> None:
    """The command line checked, then the stage (imported only then: stopexp.runtime.entry)."""
    launch("answers_replay", "stopexp.stages.answers_replay")


if __name__ == "__main__":
    main()
