"""`python -m stopexp.toy_lm`: train the embedded toy LM from scratch and show it solving test prompts."""


def main() -> None:
    """The command line checked, then the stage (imported only then: stopexp.runtime.entry)."""
    from stopexp.runtime.entry import launch

    launch("toy_lm", "stopexp.stages.toy_lm")


if __name__ == "__main__":
    main()
