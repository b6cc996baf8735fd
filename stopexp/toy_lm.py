"""`python -m stopexp.toy_lm`: train the embedded toy LM from scratch and show it solving test prompts."""
from stopexp.runtime.entry import launch


def main() -> None:
    """The command line checked, then the stage (imported only then: stopexp.runtime.entry)."""
    launch("toy_lm", "stopexp.stages.toy_lm")


if __name__ == "__main__":
    main()
