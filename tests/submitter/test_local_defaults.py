"""Issue 33, item 3: `submit --local` shows the defaults it trains with (in `--help` and in the
run's first line), and a flag or the job file always wins over them, through the real CLI
parsing into the job document the child gets (the child itself is not started here)."""

from __future__ import annotations

import json

import pytest

from submitter import local
from submitter.cli import main
from submitter.contract.spec import LOCAL_DEFAULTS, local_default_flags


@pytest.fixture
def documents(monkeypatch):
    """The job documents `submit --local` would hand to `python -m training`."""
    seen: list[dict] = []

    def follow_child(spec, storage, view, **kwargs):  # kwargs: env_extra (the estimate)
        seen.append(json.loads(spec.document()))
        return local.LocalOutcome(True, local.ev.ProgressState(status="finished"), storage, None, 0)

    monkeypatch.setattr(local, "follow_child", follow_child)
    monkeypatch.setattr(local, "require_training_stack", lambda *what: None)
    return seen


def _first_line(result) -> str:
    return result.stdout.splitlines()[0]


def test_submit_help_shows_the_local_defaults(runner):
    text = " ".join(runner.invoke(main, ["submit", "--help"]).output.split())
    assert local_default_flags().replace(" ", "") in text.replace(" ", "")  # wrapped at any space
    assert "[default: gpt2-small; submit --local: tiny]" in text
    assert "[default: 0.0006; submit --local: 0.002]" in text
    assert "[default: 10; submit --local: 5]" in text and "[submit --local: 120]" in text
    # the name a local run takes: a --script run is named after its script (not gpt2-local)
    assert "[submit --local: gpt2-local, with --script the script's (train.py: train)]" in text


def test_a_local_run_says_which_defaults_it_took(runner, storage, documents):
    result = runner.invoke(main, ["submit", "--local", "--storage-path", str(storage)])
    assert result.exit_code == 0, result.output
    assert _first_line(result) == (f"local defaults (not given): {local_default_flags()}; a flag "
                                   "or -f sets any of them (submitter submit --help)")
    document = documents[0]
    assert (document["model"], document["maxStepsPerEpoch"], document["learningRate"],
            document["progressEvery"], document["maxFailures"]) == ("tiny", 120, 2e-3, 5, 2)


def test_given_flags_win_over_the_local_defaults(runner, storage, documents):
    result = runner.invoke(main, ["submit", "--local", "--storage-path", str(storage),
                                  "--model", "gpt2-small", "--learning-rate", "1e-4",
                                  "--max-steps-per-epoch", "7", "--progress-every", "1",
                                  "--max-failures", "0", "--epochs", "1"])
    assert result.exit_code == 0, result.output
    document = documents[0]
    assert (document["model"], document["learningRate"], document["maxStepsPerEpoch"],
            document["progressEvery"], document["maxFailures"], document["epochs"]) == \
        ("gpt2-small", 1e-4, 7, 1, 0, 1)
    line = _first_line(result)
    untouched = [k for k in LOCAL_DEFAULTS if k not in (
        "model", "learning_rate", "max_steps_per_epoch", "progress_every", "max_failures", "epochs")]
    assert line.startswith(f"local defaults (not given): {local_default_flags(untouched)};")
    for flag in ("--model", "--learning-rate", "--max-steps-per-epoch", "--progress-every"):
        assert flag not in line


def test_a_job_files_settings_win_over_the_local_defaults_and_flags_over_both(runner, storage,
                                                                             documents, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model: gpt2-small\nlearning_rate: 0.0001\nmax_steps_per_epoch: 50\n")
    result = runner.invoke(main, ["submit", "--local", "-f", str(job), "--storage-path", str(storage),
                                  "--max-steps-per-epoch", "9"])
    assert result.exit_code == 0, result.output
    document = documents[0]
    assert (document["model"], document["learningRate"], document["maxStepsPerEpoch"]) == \
        ("gpt2-small", 1e-4, 9)
    line = _first_line(result)
    assert "--model" not in line and "--learning-rate" not in line and "--max-steps" not in line
    assert "--progress-every 5" in line


def test_nothing_left_to_the_local_defaults_says_nothing(runner, storage, documents, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in LOCAL_DEFAULTS.items()))
    result = runner.invoke(main, ["submit", "--local", "-f", str(job), "--storage-path", str(storage)])
    assert result.exit_code == 0, result.output
    assert "local defaults" not in result.output


def test_data_given_names_no_default_dataset(runner, storage, documents):
    """--data trains on its files: the default --dataset is not what the run reads."""
    corpus = storage / "wiki.txt"
    corpus.write_text("some text to train on\n" * 50)
    result = runner.invoke(main, ["submit", "--local", "--storage-path", str(storage),
                                  "--data", str(corpus)])
    assert result.exit_code == 0, result.output
    line = _first_line(result)
    assert line.startswith("local defaults (not given): ")
    assert "--dataset" not in line and "--model tiny" in line.replace("=", " ")
