"""`python -m stopexp.answers_replay`: replay stopping methods on an answers-only bank (`stopexp.stopping.answers`), under one."""
from stopexp.stages.answers_replay import main

if __name__ == "__main__":
    main()
