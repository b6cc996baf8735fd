"""User errors end every entry point the same way: `error: <message>` on stderr, exit code
2, no Hydra "Error executing job" and no traceback (STOPEXP_DEBUG=1 keeps the traceback);
an output that cannot be written is one such line naming its path and what to do."""
import errno
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, compose, run_stage
from stopexp.core.errors import CannotWrite, ConfigError, NotFound, UserError, reported

ENV = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
       "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
ENV.pop("HYDRA_FULL_ERROR", None)
ENV.pop("STOPEXP_DEBUG", None)
TEMPERATURE = ("error: search.temperature: must be >= 0.0001, got -1.0 (smaller temperatures "
               "overflow float32 logits; use search.do_sample=false for greedy)\n")


def stage(module: str, *args: str, env=ENV):
    return subprocess.run([sys.executable, "-m", f"stopexp.{module}", "logger=none", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_a_bad_value_on_the_command_line_is_one_line_and_exit_code_2(tmp_path):
    r = stage("train", f"paths.output_dir={tmp_path}", "search.temperature=-1")
    assert (r.returncode, r.stderr, r.stdout) == (2, TEMPERATURE, "")


def test_the_debug_switch_keeps_the_traceback(tmp_path):
    r = stage("evaluate", f"paths.output_dir={tmp_path}", "search.temperature=-1",
              env={**ENV, "STOPEXP_DEBUG": "1"})
    assert r.returncode == 1 and "Traceback" in r.stderr
    assert r.stderr.rstrip().splitlines()[-1] == ("stopexp.core.errors.ConfigError: " + TEMPERATURE[7:]).rstrip()


def test_an_output_dir_that_cannot_be_made_is_one_line_before_hydra_makes_the_run_dir(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")  # even root cannot make a directory under a file
    r = stage("collect", f"paths.output_dir={blocker / 'out'}")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f"error: paths.output_dir: cannot write to {blocker / 'out'} (Not a "
                        "directory); point paths.output_dir at a writable directory\n")


@pytest.mark.parametrize("key", ["paths.output_dir", "paths.cache_dir"])
def test_a_read_only_output_or_cache_dir_is_named_before_any_run_dir(tmp_path, read_only, key,
                                                                    capsys):
    from stopexp.stages.cli import OutputDirsCheck

    out = tmp_path / "out"
    (out / "cache").mkdir(parents=True)
    read_only(out if key == "paths.output_dir" else out / "cache")
    cfg = compose("collect", [f"paths.output_dir={out}"], return_hydra_config=True)
    with pytest.raises(SystemExit) as e:
        OutputDirsCheck().on_run_start(cfg)
    where = out if key == "paths.output_dir" else out / "cache"
    assert e.value.code == 2
    assert capsys.readouterr().err == (f"error: {key}: cannot write to {where} (Permission denied); "
                                       f"point {key} at a writable directory\n")
    assert not (out / "runs").exists()


def test_every_user_error_class_is_a_user_error():
    from stopexp.models import ModelNotAvailable
    from stopexp.search.sample import PromptTooLong
    from stopexp.signals.saved_predictor import CheckpointDamaged, CheckpointMismatch
    from stopexp.stopping.answers_bank import AnswersBankError
    from stopexp.store.bank import BankDamaged, BankMissing
    from stopexp.tasks.qa import TaskFileError
    from stopexp.training.data import NothingToLearn

    for cls in (ConfigError, NotFound, CannotWrite, AnswersBankError, BankMissing, BankDamaged,
                ModelNotAvailable, PromptTooLong, CheckpointDamaged, CheckpointMismatch,
                TaskFileError, NothingToLearn):
        assert issubclass(cls, UserError), cls


def test_reported_prints_a_user_error_and_lets_a_bug_through(monkeypatch, capsys):
    monkeypatch.delenv("STOPEXP_DEBUG", raising=False)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as e, reported():
        raise ConfigError("search.n_paths: must be >= 1, got 0")
    assert e.value.code == 2 and capsys.readouterr().err == "error: search.n_paths: must be >= 1, got 0\n"
    with pytest.raises(ZeroDivisionError), reported():  # a bug keeps its traceback
        1 / 0
    monkeypatch.setenv("STOPEXP_DEBUG", "1")
    with pytest.raises(ConfigError), reported():
        raise ConfigError("search.n_paths: must be >= 1, got 0")
    assert capsys.readouterr().err == ""


def test_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    from stopexp.runtime import artifacts

    path = tmp_path / "run" / "metrics.json"
    artifacts.write_json(path, {"old": 1})

    def full(self, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # write() names no file

    monkeypatch.setattr(artifacts.Path, "write_text", full)
    with pytest.raises(CannotWrite) as e:
        artifacts.write_json(path, {"new": 2})
    assert str(e.value) == (f"cannot write {path}: No space left on device; free space on that "
                            "disk or write to another one, then rerun (what was written before "
                            "is intact)")
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"old": 1}
    assert [p.name for p in path.parent.iterdir()] == ["metrics.json"]  # no temporary left


def test_an_error_that_is_not_the_users_passes_unchanged(tmp_path, monkeypatch):
    from stopexp.runtime import artifacts

    def broken(self, text):
        raise OSError(errno.EIO, os.strerror(errno.EIO))  # the disk itself failing: not a fix for the user

    monkeypatch.setattr(artifacts.Path, "write_text", broken)
    with pytest.raises(OSError) as e:
        artifacts.write_json(tmp_path / "m.json", {})
    assert type(e.value) is OSError and e.value.errno == errno.EIO


ANSWERS_BANK = f"bank={ROOT / 'tests' / 'data' / 'answers_bank.json'}"


def test_answers_replay_into_a_read_only_run_dir_is_one_line(tmp_path, read_only, capsys, monkeypatch):
    import stopexp.stages.answers_replay as stage

    monkeypatch.setattr(stage, "replay", lambda *a: pytest.fail("replayed before the run dir was checked"))
    out = tmp_path / "replay"
    out.mkdir()
    read_only(out)
    with pytest.raises(SystemExit) as e:
        run_stage("answers_replay", [ANSWERS_BANK, "n=4", "k=2", "shuffles=2", f"hydra.run.dir={out}"])
    assert e.value.code == 2
    assert capsys.readouterr().err == (f"error: hydra.run.dir: cannot write to {out} (Permission "
                                       "denied); point hydra.run.dir at a writable directory\n")
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("where", ["a_file", "a_file/below"])
def test_answers_replay_run_dir_that_cannot_be_a_folder_is_one_line(tmp_path, capsys, where):
    (tmp_path / "a_file").write_text("not a folder")
    out = tmp_path / where
    with pytest.raises(SystemExit) as e:
        run_stage("answers_replay", [ANSWERS_BANK, "n=4", "k=2", "shuffles=2", f"hydra.run.dir={out}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: hydra.run.dir: cannot write to {out} ") and "point hydra.run.dir" in err
    assert (tmp_path / "a_file").read_text() == "not a folder"


def test_answers_replay_refuses_a_negative_seed_before_reading_further(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        run_stage("answers_replay", [ANSWERS_BANK, "n=4", "k=2", "seed=-1", f"hydra.run.dir={tmp_path}"])
    assert e.value.code == 2 and capsys.readouterr().err == "error: seed: must be >= 0, got -1\n"


# Overrides Hydra cannot compose: one line naming the key (or the override), exit code 2,
# checked before Hydra's own report (stopexp.stages.cli.check_overrides); in a multirun every
# swept value is composed before the first job runs.
HYDRA_ERRORS = [
    (["search.n_pathz=3"], "search.n_pathz: Key 'n_pathz' not in 'ParallelSearchConfig' (Could not "
                           "override 'search.n_pathz'; check the key's spelling)"),
    (["search.n_paths=abc"], "search.n_paths: Value 'abc' of type 'str' could not be converted to "
                             "Integer (Error merging override search.n_paths=abc)"),
    (["model=nosuch"], "In 'common': Could not find 'model/nosuch'; Available options in 'model': "
                       "llama, qwen, smollm2, toy"),
    (["search.n_paths=[1"], "search.n_paths=[1: no viable alternative at input '[1'; See "
                            "https://hydra.cc/docs/1.2/advanced/override_grammar/basic for details"),
    (["search.n_paths=4,8"], "Ambiguous value for argument 'search.n_paths=4,8'; 1. To use it as a list"),
    (["-m", "search.n_paths=4,abc"], "search.n_paths: Value 'abc' of type 'str' could not be "
                                     "converted to Integer (Error merging override search.n_paths=abc)"),
    (["-m", "+exp=toy_contrastive", "model=toy,nosuch"], "In 'common': Could not find 'model/nosuch'"),
    # a key inside a node that only another option of its group fills
    (["model=smollm2", "model.toy.hidden_size=8"],
     "model.toy.hidden_size: model.toy is read only by model=toy, not under model=smollm2 (null "
     "there); drop model.toy.hidden_size=8"),
    (["+exp=smollm2_datatotext", "+model.toy.seed=1"],
     "model.toy.seed: model.toy is read only by model=toy, not under model=smollm2 (null there); "
     "drop +model.toy.seed=1"),
    (["-m", "model=toy,smollm2", "model.toy.seed=3"],
     "model.toy.seed: model.toy is read only by model=toy, not under model=smollm2 (null there); "
     "drop model.toy.seed=3"),
    (["search=beam", "search.beam_checks.0=0.2"],  # no search option fills it (+exp=toy_beam does)
     "search.beam_checks.0: search.beam_checks is null, so nothing inside it can be set; set "
     "search.beam_checks itself (e.g. search.beam_checks=[...])"),
    (["collect.keep_correct.1=3"], "collect.keep_correct.1: collect.keep_correct is null, so nothing "
                                   "inside it can be set; set collect.keep_correct itself"),
    (["search.n_paths=4", "model=null"], "model=null: model is a config group; give one of its options"),
    (["+exp=null"], "+exp=null: exp is a config group; give one of its options"),
]


@pytest.mark.parametrize("argv, message", HYDRA_ERRORS)
def test_an_override_hydra_cannot_compose_is_one_line_naming_it(argv, message):
    from stopexp.stages.cli import check_overrides

    with pytest.raises(ConfigError) as e:
        check_overrides("collect", argv)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("argv", [
    ["-m", "search.n_paths=4,8", "model=toy"],
    pytest.param(["-m", "+exp=toy_contrastive", "+hparams_search=optuna_toy"],  # 36 jobs
                 marks=pytest.mark.slow),
    ["-m", "+exp=toy_contrastive", "+hparams_search=optuna_toy", "hydra.sweeper.params.predictor=mlp",
     "hydra.sweeper.params.loss=contrastive", "hydra.sweeper.params.policy=quantile"],  # 2 jobs
    ["+exp=toy_shift"], ["+exp=smollm2_datatotext"], ["+model.toy.train_task.n_steps=6"],
    ["model=toy", "model.toy.hidden_size=8"], ["--cfg", "job", "+exp=toy_beam", "search.beam_checks.0=0.1"]])
def test_overrides_hydra_composes_pass_the_check(argv):
    from stopexp.stages.cli import check_overrides

    check_overrides("pipeline", argv)


# A sweep: every job (the product of the swept values, Hydra's basic sweeper's jobs; an
# Optuna interval's two ends) is composed and validated before the first one starts.
SWEEP_ERRORS = [
    (["-m", "search.n_paths=4,0"], "search.n_paths: N must be >= 1, got 0 (sweep job 2 of 2: "
                                   "search.n_paths=0)"),
    # a combination no single value fails: K=8 of N=4
    (["-m", "search.n_paths=4,64", "evaluate.retention=[2],[8]"],
     "evaluate.retention: K=8 must lie in 1..N=4 (search.n_paths); change it with search.n_paths, "
     "or leave evaluate.retention unset: it is derived from search.n_paths (stopexp.config.derived_*) "
     "(sweep job 2 of 4: search.n_paths=4 evaluate.retention=[8])"),
    (["-m", "search.n_paths=range(0,3)"], "search.n_paths: N must be >= 1, got 0 (sweep job 1 of 3: "
                                          "search.n_paths=0)"),
    (["-m", "+exp=toy_contrastive", "policy=topk,quantile", "policy.keep=8"],
     "policy.keep: set by policy.keep=8, but read only by policy=topk, not under policy=quantile; "
     "drop it (or set it as ${stopexp_where_read:policy.keep,VALUE}, VALUE where it is read) "
     "(sweep job 2 of 2: policy=quantile)"),
    # an Optuna search space: its choices (hparams_search/optuna_toy.yaml) times the interval's ends
    (["-m", "+exp=toy_contrastive", "+hparams_search=optuna_toy", "train.lr=interval(0.0,0.1)"],
     "train.lr: must lie in (0, inf), got 0.0 (sweep job 1 of 36: predictor=linear "
     "loss=contrastive policy=topk train.lr=0.0)"),
]


@pytest.mark.parametrize("argv, message", SWEEP_ERRORS)
def test_every_job_of_a_sweep_is_validated_before_the_first_starts(argv, message):
    from stopexp.runtime.overrides import check_overrides

    with pytest.raises(ConfigError) as e:
        check_overrides("evaluate", argv)
    assert str(e.value) == message


def test_a_sweep_that_sets_each_policys_knob_where_it_is_read_passes():
    from stopexp.runtime.overrides import check_overrides, sweep_jobs

    budgets = ["policy.keep=${stopexp_where_read:policy.keep,8}",
               "policy.quantile=${stopexp_where_read:policy.quantile,0.875}",
               "policy.target_prune_rate=${stopexp_where_read:policy.target_prune_rate,0.875}"]
    check_overrides("pipeline", ["-m", "+exp=toy_contrastive", "policy=topk,quantile,adaptive,fixed", *budgets])
    assert sweep_jobs({}, ["policy=topk,fixed", "search.n_paths=range(8,24,8)"], None) == [
        [f"policy={p}", f"search.n_paths={n}"] for p in ("topk", "fixed") for n in (8, 16)]


@pytest.mark.parametrize("argv, key, chosen", [
    (["policy=quantile", "policy.keep=8"], "policy.keep", "policy=quantile"),  # 8: its default
    (["policy=topk", "policy.gain=0.1"], "policy.gain", "policy=topk"),
    (["policy=fixed", "policy.quantile=0.5"], "policy.quantile", "policy=fixed"),
    (["predictor=statistic", "train.lr=0.001"], "train.lr", "predictor=statistic"),
    (["evaluate.methods=[no_prune]", "evaluate.stopping.esc.window=8"], "evaluate.stopping.esc.window",
     "evaluate.methods without esc")])
def test_a_key_set_on_the_command_line_that_the_chosen_option_ignores_is_refused(argv, key, chosen):
    """Even at its default value (check_unread sees values only)."""
    from stopexp.runtime.overrides import check_overrides

    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: set by {re.escape(argv[1])}, but read "
                                          rf"only by .*, not under {re.escape(chosen)}; drop it"):
        check_overrides("evaluate", argv, validate_run=True)
    check_overrides("evaluate", [argv[0], f"{key}=${{stopexp_where_read:{key},{argv[1].split('=')[1]}}}"],
                    validate_run=True)


@pytest.mark.parametrize("overrides, message", [
    (["train.epoks=3"], r"^train\.epoks: Key 'epoks' not in 'TrainConfig'"),
    (["predictor=nope"], r"Could not find 'predictor/nope'; Available options in 'predictor': "),
    (["search.temperature=hot"], r"^search\.temperature: Value 'hot' of type 'str' could not be converted"),
    (["policy=topk", "policy.quantile=0.3"], r"^policy\.quantile: .*policy=topk"),
    (["predictor=mlp,linear"], r"^predictor=mlp,linear: a sweep; stage_config composes one job"),
    (["-m", "predictor=mlp"], r"^-m: a command-line flag"),
    (["train.epochs=[1"], r"^train\.epochs=\[1: no viable alternative"),
])
def test_a_config_composed_from_python_refuses_a_bad_override_in_one_line(overrides, message):
    """What scripts and notebooks compose (stage_config) is checked as the command line is."""
    from stopexp.runtime.overrides import stage_config

    with pytest.raises(ConfigError, match=message) as e:
        stage_config("train", ["+exp=toy_contrastive", *overrides])
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^stage: 'answers_replay'; stage_config composes adapt, "):
        stage_config("answers_replay")  # a config of its own


def test_a_config_composed_from_python_is_the_validated_stage_config_without_a_tracker():
    """Without a tracker unless an override sets the logger; a Hydra the caller initialised
    is set aside for the call and there again after it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from stopexp.runtime.overrides import CONF_DIR, stage_config

    cfg = stage_config("train", ["+exp=toy_contrastive", "train.epochs=3"])
    assert cfg.train.epochs == 3 and cfg.logger.name == "none"
    assert stage_config("train", ["logger=wandb"]).logger.name == "wandb"
    online = stage_config("train", ["logger.mode=online"]).logger
    assert (online.name, online.mode) == ("wandb", "online")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        assert stage_config("collect", ["search.n_paths=4"]).search.n_paths == 4
        assert hydra_compose("collect").search.n_paths != 4


@pytest.mark.parametrize("key, mode", [("hydra.run.dir", "run"), ("hydra.sweep.dir", "multirun")])
def test_a_run_dir_that_cannot_be_written_is_one_line_before_hydra_makes_it(tmp_path, key, mode,
                                                                           capsys):
    from stopexp.stages.cli import OutputDirsCheck

    blocker = tmp_path / "a_file"
    blocker.write_text("")  # even root cannot make a directory under a file
    cfg = compose("evaluate", [f"paths.output_dir={tmp_path / 'out'}", f"{key}={blocker / 'run'}"],
                  return_hydra_config=True)
    with pytest.raises(SystemExit) as e:
        getattr(OutputDirsCheck(), f"on_{mode}_start")(cfg)
    assert e.value.code == 2
    assert capsys.readouterr().err == (f"error: {key}: cannot write to {blocker / 'run'} (Not a "
                                       f"directory); point {key} at a writable directory\n")


def test_a_read_only_run_dir_is_named(tmp_path, read_only, capsys):
    from stopexp.stages.cli import OutputDirsCheck

    run = tmp_path / "run"
    run.mkdir()
    read_only(run)
    cfg = compose("evaluate", [f"paths.output_dir={tmp_path / 'out'}", f"hydra.run.dir={run}"],
                  return_hydra_config=True)
    with pytest.raises(SystemExit):
        OutputDirsCheck().on_run_start(cfg)
    assert capsys.readouterr().err == (f"error: hydra.run.dir: cannot write to {run} (Permission "
                                       "denied); point hydra.run.dir at a writable directory\n")


@pytest.mark.parametrize("module", ["collect", "featurize", "train", "evaluate", "pipeline", "adapt",
                                    "toy_lm"])
def test_every_hydra_entry_point_reports_a_misspelt_key_in_one_line(module, monkeypatch, capsys):
    import importlib

    main = importlib.import_module(f"stopexp.{module}").main
    monkeypatch.setattr(sys, "argv", [module, "search.n_pathz=3"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    assert capsys.readouterr().err == f"error: {HYDRA_ERRORS[0][1]}\n"


def test_a_key_of_another_models_section_is_one_line_from_the_cli(tmp_path):
    r = stage("collect", f"paths.output_dir={tmp_path}", "model=smollm2", "model.toy.hidden_size=8")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"error: {HYDRA_ERRORS[7][1]}\n"
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # before Hydra made a run dir


def test_hydras_full_error_switch_keeps_the_trace_of_a_bad_override(tmp_path):
    r = stage("train", f"paths.output_dir={tmp_path}", "search.n_pathz=3",
              env={**ENV, "HYDRA_FULL_ERROR": "1"})
    assert r.returncode == 1 and "Traceback" in r.stderr
    assert "hydra.errors.ConfigCompositionException: Could not override 'search.n_pathz'." in r.stderr


def test_a_file_of_the_run_dir_that_cannot_be_written_names_hydra_run_dir(tmp_path, capsys):
    """metrics.json, plots, the config: a stage's own files in its run dir."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from stopexp.stages.cli import user_errors

    run = tmp_path / "out" / "runs" / "evaluate" / "r1"
    cfg = compose("evaluate", [f"paths.output_dir={tmp_path / 'out'}", f"hydra.run.dir={run}"],
                  return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(run)

    def task(cfg):
        raise CannotWrite(run / "metrics.json", PermissionError(errno.EACCES, os.strerror(errno.EACCES)))

    HydraConfig.instance().set_config(cfg)
    try:
        with pytest.raises(SystemExit):
            user_errors(task)(cfg)
    finally:
        HydraConfig.instance().cfg = None
    assert capsys.readouterr().err == (f"error: cannot write {run / 'metrics.json'}: Permission denied; "
                                       "make it writable or point hydra.run.dir at a directory you "
                                       "can write, then rerun (what was written before is intact)\n")
