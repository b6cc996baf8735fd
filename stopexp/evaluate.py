"""`python -m stopexp.evaluate`: stage 3, evaluate: prune with every method under one accounting, and show it."""
from stopexp.stages.evaluate import main

if __name__ == "__main__":
    main()
