"""`python -m stopexp.pipeline`: the whole study on one config: collect -> featurize -> train -> evaluate, each stage reusing what."""
from stopexp.stages.pipeline import main

if __name__ == "__main__":
    main()
