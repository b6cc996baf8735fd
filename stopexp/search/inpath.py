"""Stopping inside running paths, online: a stopping method's controller watches every
path as the engine generates it and aborts the ones its protocol stops, on any engine
(stopexp.search.stepping). DeepConf online (stopexp.stopping.deepconf) and STEP
(stopexp.stopping.step) run here; replay of a bank decides the same, path for path.

The paths of a prompt are launched in the controller's waves (DeepConf: the warm-up paths,
then the rest; STEP: all together), each path with its own stream seed, as collect and
Launch-Check-Resume launch them. After every engine step the controller sees each prompt's
paths that were running before it (a path that ended in that step included) and names the
ones to stop with the tokens they spent, counted where the protocol stopped them (an
engine that ran a path past that point spent the rest for nothing); they are aborted at
once and leave the engine's cache. At the end of a wave the controller sees its paths
(DeepConf sets its threshold there). A path never stopped votes, weighted by the
controller's `weights`.

    class Controller(Protocol):
        def waves(self, n) -> list[range]                    # path ids of each wave
        def stops(self, stepper, prompt, paths) -> list[(path, spent)]
        def wave_done(self, stepper, wave, prompt, paths) -> None
        weights: dict                                        # (prompt, path id) -> vote weight
"""
from __future__ import annotations

import time

from stopexp.search.lcr import OnlineRun
from stopexp.search.sample import launch_lists, path_labels
from stopexp.search.stepping import Running, Steps


def run_in_path(steps: Steps, tokenizer, problems, n_paths: int, seed: int, controller) -> OnlineRun:
    """The controller's method on `problems` (`n_paths` per prompt, stream seeds from
    `seed`), chunk of prompts by chunk: an `OnlineRun` whose `pruned_at` holds the tokens
    each stopped path spent, `signal` each voter's weight, and `kv` the cached tokens per
    prompt; its time is launch-to-end in `resume_s`, of which the controller's own in `check_s`."""
    run = OnlineRun()
    start = time.perf_counter()
    for chunk in steps.chunks(len(problems), n_paths):
        prompts, seeds, owners = launch_lists(tokenizer, problems, chunk, n_paths, seed)
        labels = path_labels(problems, owners)
        for w, ids in enumerate(controller.waves(n_paths)):
            rows = [r for r, key in enumerate(owners) if key[1] in ids]
            wave = [Running(owners[r], prompts[r], seeds[r]) for r in rows]
            stepper = steps.start(wave, run.kv, [labels[r] for r in rows])
            ended: set = set()
            while stepper.running:
                stepper.step()
                stepper.observe()  # a stopped path held its last token's cache (as replay counts it)
                tic = time.perf_counter()
                stopped = controller_stops(controller, stepper, wave, ended)
                if stopped:
                    running = [p for p, _ in stopped if not p.finished]
                    if running:
                        stepper.abort(running)
                    for p, spent in stopped:
                        p.pruned = True
                        run.pruned_at[p.key] = spent
                run.check_s += time.perf_counter() - tic
            tic = time.perf_counter()
            for g, paths in _by_prompt(wave).items():
                controller.wave_done(stepper, w, g, paths)
            run.check_s += time.perf_counter() - tic
            for p in wave:
                if p.key in run.pruned_at:
                    run.length[p.key], run.text[p.key] = run.pruned_at[p.key], ""
                else:
                    run.finish(p.key, list(p.tokens), tokenizer)
    for key in run.length:
        run.kept[key] = key not in run.pruned_at
        if run.kept[key]:
            run.signal[key] = float(controller.weights[key])
    run.resume_s = time.perf_counter() - start - run.check_s
    return run


def controller_stops(controller, stepper, wave: list[Running], ended: set) -> list[tuple[Running, int]]:
    """What the controller stops after a step, prompt by prompt, among the paths that were
    running before it: an ended path is shown once, with its last tokens (`ended` holds the
    keys already shown ended)."""
    out = []
    shown = [p for p in wave if not p.pruned and p.key not in ended]
    for g, paths in _by_prompt(shown).items():
        out += controller.stops(stepper, g, paths)
    ended.update(p.key for p in shown if p.finished)
    return out


def _by_prompt(paths: list[Running]) -> dict:
    groups: dict = {}
    for p in paths:
        groups.setdefault(p.key[0], []).append(p)
    return groups
