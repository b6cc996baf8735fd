"""One recipe per stage: collect, featurize, train, evaluate, adapt, pipeline,
answers_replay, toy_lm."""
