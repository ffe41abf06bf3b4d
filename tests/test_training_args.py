"""`python -m training` flags: the render's command line parses, defaults come from JobSpec."""

from __future__ import annotations

import subprocess
import sys

import pytest

from submitter.errors import UsageError
from submitter.render import training_args
from submitter.spec import JobSpec, defaults
from training.args import SPEC_FLAGS, parse_args
from training.config import TrainConfig
from training.loop import checkpoint_name, resume_point
from training.model import lr_factor


def test_defaults_are_jobspecs():
    cfg = parse_args(["--name", "job"])
    d = defaults()
    for key in SPEC_FLAGS:
        if key != "name" and key != "storage_path":
            assert getattr(cfg, key) == d[key], key
    assert cfg.storage_path == d["storage_mount"]  # JobSpec.resolved_storage_path
    assert cfg.num_workers == d["replicas"] and cfg.use_gpu is False
    assert cfg.run_name == "job"


def test_train_config_defaults_are_jobspecs_too():
    d, cfg = defaults(), TrainConfig()
    for key in set(SPEC_FLAGS) - {"storage_path"}:
        assert getattr(cfg, key) == d[key], key
    assert (cfg.storage_path, cfg.num_workers) == (d["storage_mount"], d["replicas"])


def test_the_ephemeral_override_travels_through_render():
    spec = JobSpec.build({"name": "eph", "allow_ephemeral_storage": True, "replicas": 1})
    cfg = parse_args(training_args(spec, "/mnt/checkpoints")[3:])
    assert cfg.allow_ephemeral_storage is True


@pytest.mark.parametrize("spec", [
    JobSpec.build({"name": "demo"}),
    JobSpec.build({"name": "big", "replicas": 4, "gpu_per_pod": 2, "model": "tiny",
                   "max_steps_per_epoch": 7, "data": "s3://b/train.parquet",
                   "bpe_file": "/mnt/checkpoints/gpt2.tiktoken", "fsdp": True, "epochs": 5,
                   "learning_rate": 3e-4, "seed": 7, "num_to_keep": 4, "max_failures": 9}),
])
def test_the_rendered_command_line_parses_to_the_same_job(spec):
    argv = training_args(spec, "/mnt/checkpoints")
    assert argv[:3] == ["python", "-m", "training"]
    cfg = parse_args(argv[3:])
    assert cfg.num_workers == spec.num_train_workers and cfg.use_gpu == bool(spec.gpu_per_pod)
    skip = {"storage_path"} | ({"dataset", "dataset_config"} if spec.data else set())
    for key in set(SPEC_FLAGS) - skip:
        assert getattr(cfg, key) == getattr(spec, key), key
    assert cfg.storage_path == "/mnt/checkpoints"


def test_entrypoint_only_flags():
    cfg = parse_args(["--name", "job", "--replicas", "3", "--run-name", "job-retry1",
                      "--allow-ephemeral-storage", "--progress-every", "2", "--block-size", "32",
                      "--checkpoint-every", "5", "--tokenizer", "byte"])
    assert (cfg.num_workers, cfg.run_name, cfg.allow_ephemeral_storage) == (3, "job-retry1", True)
    assert (cfg.progress_every, cfg.block_size, cfg.checkpoint_every, cfg.tokenizer) == (2, 32, 5, "byte")
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("argv, words", [
    (["--name", "job", "--model", "huge"], "invalid choice"),
    (["--name", "job", "--epochs", "0"], "--epochs"),
    (["--name", "Bad_Name"], "not a valid name"),
    (["--name", "job", "--epochs", "two"], "invalid int"),
    (["--name", "job", "--progress-every", "0"], "--progress-every"),
    (["--name", "job", "--run-name", "../escape"], "--run-name"),
    (["--name", "job", "--bogus"], "unrecognized"),
])
def test_bad_input_is_a_usage_error(argv, words):
    with pytest.raises(UsageError) as e:
        parse_args(argv)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_module_entrypoint_bad_input_exits_2_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "training", "--name", "job", "--storage-path",
                           "relative/x"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "relative" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_resume_point():
    assert resume_point(None) == (0, 0, 0)
    done = {"epoch": 0, "step": 40, "step_in_epoch": 40, "epoch_done": True}
    assert resume_point(done) == (1, 0, 40)
    mid = {"epoch": 1, "step": 55, "step_in_epoch": 15, "epoch_done": False}
    assert resume_point(mid) == (1, 15, 55)
    assert checkpoint_name(2, 55) < checkpoint_name(2, 100) < checkpoint_name(10, 5)


def test_lr_schedule_warmup_then_cosine():
    f = [lr_factor(s, 10, 100, 0.1) for s in range(120)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:100], f[11:100]))
    assert f[99] == pytest.approx(0.1, abs=1e-3) and f[119] == 0.1


def test_the_entrypoint_imports_light_and_never_kubernetes_at_module_level():
    code = ("import sys, training.args, training.config, training.events, training.emitter, "
            "training.mounts, training.loop, training.driver, training.tokens, training.model, "
            "training.data, training.__main__; "
            "print(sorted(m for m in ('kubernetes', 'ray', 'torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # training.data needs numpy only; ray/torch/transformers load inside the functions
    assert out.stdout.strip() == "[]"
