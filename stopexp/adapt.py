"""`python -m stopexp.adapt`: online fine-tuning of the signal predictor from pruning feedback, under a distribution shift."""
from stopexp.stages.adapt import main

if __name__ == "__main__":
    main()
