"""`python -m stopexp.train`: stage 2, train: fit the signal predictor on the trace bank, the LM frozen (not loaded."""
from stopexp.stages.train import main

if __name__ == "__main__":
    main()
