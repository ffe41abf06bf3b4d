"""A model that leaves: checkpoint -> Hugging Face directory, loaded back by transformers.

CPU, the tiny preset, no Ray: the checkpoint is built the way the loop builds it
(`get_state_dict` + `save_state`), then exported and compared logit for logit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from submitter.contract.errors import NotFound, UsageError  # noqa: E402
from training.run.checkpoint_io import load_state, save_state  # noqa: E402
from training.gpt2.export import (TOKENIZER_INFO, check_registered, export_checkpoint,  # noqa: E402
                             latest_checkpoint, prompt_from, sample_text)
from training.gpt2.model import (BETAS, MIN_LR_RATIO, build_model, build_optimizer,  # noqa: E402
                            build_scheduler, gpt2_config)
from training.data.tokens import BYTE_EOT_ID, byte_encoding  # noqa: E402

BYTE_VOCAB = 257


def _checkpoint(directory, vocab_rows: int = BYTE_VOCAB, steps: int = 2) -> "torch.nn.Module":
    """Train a tiny GPT-2 a few steps and save its checkpoint as the loop does; returns the model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from training.gpt2.config import TrainConfig
    from submitter.contract.spec import JobSpec

    torch.manual_seed(0)
    config = gpt2_config("tiny", vocab_rows, BYTE_EOT_ID, 32)
    model = build_model(config)
    optimizer = build_optimizer(model, 1e-3, 0.1, BETAS)
    scheduler = build_scheduler(optimizer, 1, 10, MIN_LR_RATIO)
    x = torch.randint(0, BYTE_VOCAB, (2, 32))
    for _ in range(steps):
        loss = model(input_ids=x, labels=x).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    model_sd, optim_sd = get_state_dict(model, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    cfg = TrainConfig.from_spec(JobSpec.build(name="x", model="tiny"), "/data/runs")
    os.makedirs(directory, exist_ok=True)
    save_state(str(directory), model=model_sd, optimizer=optim_sd,
               scheduler=scheduler.state_dict(), epoch=0, step=steps, step_in_epoch=steps,
               epoch_done=False, config=cfg.to_dict(), model_config=config.to_dict())
    model.eval()
    return model


def test_what_the_loop_saves_loads_with_weights_only(tmp_path):
    _checkpoint(tmp_path)
    state = torch.load(tmp_path / "state.pt", weights_only=True)  # raises on any pickled object
    assert {"model", "optimizer", "scheduler", "config", "model_config"} <= set(state)
    assert state["step"] == 2 and state["config"]["run_name"] == "x"
    assert load_state(str(tmp_path))["scheduler"]["last_epoch"] == 2


def test_save_state_refuses_what_weights_only_could_not_read(tmp_path):
    with pytest.raises(TypeError, match="weights_only"):
        save_state(str(tmp_path), model={}, optimizer={}, scheduler={"f": lambda s: s},
                   epoch=0, step=0, step_in_epoch=0, epoch_done=False, config={},
                   model_config={})


def test_the_exported_model_loads_with_transformers_and_gives_the_checkpoints_logits(tmp_path):
    from transformers import GPT2LMHeadModel

    model = _checkpoint(tmp_path / "ck")
    out = export_checkpoint(str(tmp_path / "ck"), str(tmp_path / "hf"),
                            {"identity": {"tokenizer": "byte", "vocab_size": BYTE_VOCAB}})
    files = set(os.listdir(tmp_path / "hf"))
    assert {"config.json", "model.safetensors", TOKENIZER_INFO} <= files
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path / "hf")
    x = torch.randint(0, BYTE_VOCAB, (3, 20))
    with torch.no_grad():
        # the trainer pads the embedding (a multiple of 64 rows); the export keeps the vocabulary's
        want = model(input_ids=x).logits[..., :BYTE_VOCAB]
        assert loaded.config.vocab_size == BYTE_VOCAB
        assert torch.allclose(loaded(input_ids=x).logits, want, atol=1e-5)
    info = json.loads((tmp_path / "hf" / TOKENIZER_INFO).read_text())
    assert info["kind"] == "byte" and info["eot_token_id"] == BYTE_EOT_ID
    assert out["sample"].startswith("The ") and len(out["sample"]) > len("The ")


def test_a_padded_vocabulary_is_sliced_to_the_tokenizers_on_export(tmp_path):
    """A trainer may pad the embedding to a multiple of 64 for speed; the exported model keeps
    exactly the vocabulary's logits."""
    from transformers import GPT2LMHeadModel

    model = _checkpoint(tmp_path / "ck", vocab_rows=320)
    export_checkpoint(str(tmp_path / "ck"), str(tmp_path / "hf"),
                      {"identity": {"tokenizer": "byte", "vocab_size": BYTE_VOCAB}})
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path / "hf")
    assert loaded.config.vocab_size == BYTE_VOCAB
    x = torch.randint(0, BYTE_VOCAB, (2, 16))
    with torch.no_grad():
        want = model(input_ids=x).logits[..., :BYTE_VOCAB]
        assert torch.allclose(loaded(input_ids=x).logits, want, atol=1e-5)


def test_the_sample_is_drawn_at_a_temperature_and_repeatable_by_seed(tmp_path):
    model = _checkpoint(tmp_path)
    enc = byte_encoding()
    first = sample_text(model, enc, "def main(", tokens=24)
    assert first.startswith("def main(") and first == sample_text(model, enc, "def main(", tokens=24)
    # drawn, not argmax: other seeds give other continuations, and near-zero temperature is greedy
    assert len({sample_text(model, enc, "def main(", tokens=24, seed=s) for s in range(4)}) > 1
    greedy = sample_text(model, enc, "def main(", tokens=24, temperature=1e-9, top_k=0)
    assert greedy == sample_text(model, enc, "def main(", tokens=24, temperature=1e-9, top_k=0, seed=7)


def test_the_prompt_is_the_start_of_a_training_row_cut_at_a_space():
    rows = ["", "   ", "#!", '"""Record of phased-in   incompatible language changes.', "x"]
    assert prompt_from(rows) == '"""Record of phased-in incompatible '
    assert prompt_from(["The quick brown fox"]) == "The quick brown fox "
    assert prompt_from(["", "abcdefghijklmnopqrstuvwxyz0123456789abcdefghij"]) == "The "  # no words
    assert prompt_from([]) == "The "


def register(run_dir: Path, *names: str) -> None:
    """Ray Train's run snapshot (checkpoint_manager_snapshot.json, as Ray 2.60 writes it),
    listing `names` as registered; the last is the latest."""
    def result(name: str) -> dict:
        return {"version": 0, "checkpoint_dir_name": name, "metrics": {"step": 1}}

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "checkpoint_manager_snapshot.json").write_text(json.dumps({
        "ray_version": "2.60.0", "checkpoint_results": [result(n) for n in names],
        "checkpoint_report_indices": list(range(1, len(names) + 1)),
        "latest_checkpoint_result": result(names[-1]) if names else None,
        "pending_training_results": [], "pending_validation_specs": [],
        "current_report_index": len(names), "validated_checkpoint_dir_names": [],
        "timed_out_validation_checkpoint_dir_names": [],
        "failed_validation_checkpoint_dir_names": []}))


def test_latest_checkpoint_is_the_highest_registered_step(tmp_path):
    names = ("checkpoint_epoch001_step0000040", "checkpoint_epoch002_step0000080",
             "checkpoint_epoch002_step0000060")
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.pt").write_bytes(b"")
    register(tmp_path, *names)
    (tmp_path / "checkpoint_epoch003_step0000100").mkdir()  # no state: not a checkpoint
    lines: list[str] = []
    assert latest_checkpoint(str(tmp_path), lines.append).endswith("checkpoint_epoch002_step0000080")
    assert lines == []
    with pytest.raises(NotFound, match="no run"):  # exit 6: a run that does not exist
        latest_checkpoint(str(tmp_path / "absent"))


def test_a_torn_upload_is_skipped_with_one_line(tmp_path):
    """A kill during an upload leaves the newest directory with a state.pt that Ray Train
    never registered: export takes the newest registered one and says what it skipped."""
    for name in ("checkpoint_epoch001_step0000040", "checkpoint_epoch001_step0000050"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.pt").write_bytes(b"")
    register(tmp_path, "checkpoint_epoch001_step0000040")
    lines: list[str] = []
    assert latest_checkpoint(str(tmp_path), lines.append).endswith("step0000040")
    assert len(lines) == 1 and "skipping checkpoint_epoch001_step0000050" in lines[0]
    assert "not registered" in lines[0]
    with pytest.raises(UsageError, match="never registered"):
        check_registered(str(tmp_path / "checkpoint_epoch001_step0000050"))
    check_registered(str(tmp_path / "checkpoint_epoch001_step0000040"))
    (tmp_path / "checkpoint_manager_snapshot.json").unlink()  # nothing registered at all
    with pytest.raises(UsageError, match="no complete checkpoint"):
        latest_checkpoint(str(tmp_path), lines.append)


def test_submitter_export_runs_python_m_training_export(tmp_path, runner):
    """The CLI never imports torch: it runs `python -m training export` as a child process."""
    from tests.conftest import ROOT
    from submitter.cli import main

    _checkpoint(tmp_path / "runs" / "job" / "checkpoint_epoch001_step0000002")
    register(tmp_path / "runs" / "job", "checkpoint_epoch001_step0000002")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "submitter", "export", "job", "--storage-path",
                           str(tmp_path / "runs"), "-o", str(tmp_path / "hf")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "exported" in proc.stdout and "sample: 'The " in proc.stdout
    assert (tmp_path / "hf" / "model.safetensors").exists()
    again = subprocess.run([sys.executable, "-m", "submitter", "export", "job", "--storage-path",
                            str(tmp_path / "runs"), "-o", str(tmp_path / "hf")],
                           capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 2 and "not an empty directory" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    missing = runner.invoke(main, ["export", "nope", "--storage-path", str(tmp_path / "runs"),
                                   "-o", str(tmp_path / "hf2")])
    assert missing.exit_code == 6  # the exit-code table: a run that does not exist


def test_without_a_run_record_the_padded_configs_tokenizer_size_decides(tmp_path):
    from transformers import GPT2LMHeadModel

    _checkpoint(tmp_path / "ck", vocab_rows=320)
    state = load_state(str(tmp_path / "ck"))
    state["model_config"]["tokenizer_vocab_size"] = BYTE_VOCAB  # what a padding trainer records
    save_state(str(tmp_path / "ck"), **state)
    export_checkpoint(str(tmp_path / "ck"), str(tmp_path / "hf"), None)
    assert GPT2LMHeadModel.from_pretrained(tmp_path / "hf").config.vocab_size == BYTE_VOCAB
