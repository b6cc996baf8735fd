"""`python -m stopexp.toy_lm`: train the embedded toy LM from scratch and show it solving test prompts."""
from stopexp.stages.toy_lm import main

if __name__ == "__main__":
    main()
