"""`python -m stopexp.serve`: the OpenAI-compatible server over the exp's engine, with its
predictor pruning each request's paths (stopexp.stages.serve)."""
from stopexp.runtime.entry import launch


def main() -> None:
    """The command line checked, then the stage (imported only then: stopexp.runtime.entry)."""
    launch("serve", "stopexp.stages.serve")


if __name__ == "__main__":
    main()
