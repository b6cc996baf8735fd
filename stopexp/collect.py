"""`python -m stopexp.collect`: stage 1, collect: run the LM without pruning and fill the trace bank."""
from stopexp.stages.collect import main

if __name__ == "__main__":
    main()
