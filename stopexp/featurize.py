"""`python -m stopexp.featurize`: stage 1b, featurize: extract the tapped hidden states of the trace bank's paths."""
from stopexp.stages.featurize import main

if __name__ == "__main__":
    main()
