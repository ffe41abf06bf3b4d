"""A run without validation (a corpus with no validation split, prepared or read on the fly)
says so plainly, at the start and at the end, instead of `val_loss n/a` followed by a "best
checkpoint (val_loss)"; Ray Train keeps its checkpoints by recency instead of failing on a
val_loss of None at the second one."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow.fs as pafs
import pytest

from submitter.contract import events as ev
from submitter.event_text import NO_VALIDATION_CHECKPOINTS, describe
from submitter.local import summary_lines
from tests.support.corpus import make_corpus
from training.run.preempt import UNSCORED
from training.run_plan import no_validation

BLOCK = 16


def _finished(**metrics):
    return {"type": "epoch_finished", "time": "t", "seq": 1, "epoch": 1, "train_loss": 2.0,
            "tokens_per_sec": 10.0, **metrics}


def test_the_epoch_line_says_there_is_no_validation_not_n_a():
    line = describe(_finished(val_loss=None))
    assert "no validation split" in line and "n/a" not in line
    assert "val_loss 1.5000" in describe(_finished(val_loss=1.5))


def test_the_summary_says_checkpoints_are_kept_by_recency_not_best_by_val_loss(tmp_path):
    (tmp_path / "checkpoint_epoch002_step0000020").mkdir()
    state = ev.ProgressState(status="finished", metrics={
        "epoch": 2, "step": 20, "train_loss": 2.5, "val_loss": None, "tokens_per_sec": 1000.0,
        "best_checkpoint": str(tmp_path / "checkpoint_epoch002_step0000020")})
    text = "\n".join(summary_lines(SimpleNamespace(ok=True, state=state, run_dir=str(tmp_path),
                                                    error=None)))
    assert NO_VALIDATION_CHECKPOINTS in text and "n/a" not in text
    assert "best checkpoint" not in text
    state.metrics["val_loss"] = 2.25
    text = "\n".join(summary_lines(SimpleNamespace(ok=True, state=state, run_dir=str(tmp_path),
                                                    error=None)))
    assert "val_loss 2.2500" in text and "best checkpoint (val_loss): " in text
    assert NO_VALIDATION_CHECKPOINTS not in text


def test_ray_ranks_unvalidated_checkpoints_by_recency():
    """Ray Train's own ranking (its checkpoint manager's score and sorted insert, which Train
    v2 uses): a val_loss of None is a TypeError; `scored` metrics rank unvalidated checkpoints
    below validated ones and among themselves by report order."""
    from ray.train import CheckpointConfig
    from ray.train._internal.checkpoint_manager import (_CheckpointManager,
                                                        _insert_into_sorted_list)
    from ray.train._internal.session import _TrainingResult

    from training.run.checkpoint_events import event_fields, scored, validated

    manager = _CheckpointManager(CheckpointConfig(
        num_to_keep=2, checkpoint_score_attribute="val_loss", checkpoint_score_order="min"))
    with pytest.raises(TypeError):
        manager._get_checkpoint_score(_TrainingResult(checkpoint=None,
                                                      metrics={"val_loss": None}))
    kept, index = [], {}
    for i, loss in enumerate([None, None, 3.0, None]):
        result = _TrainingResult(checkpoint=f"c{i}", metrics=scored({"val_loss": loss}))
        index[result.checkpoint] = i
        _insert_into_sorted_list(kept, result, key=manager._get_checkpoint_score,
                                 checkpoint_to_report_index=index)
    # best last: the validated one, then the unvalidated by recency (kept: the last two)
    assert [r.checkpoint for r in kept] == ["c0", "c1", "c3", "c2"]
    assert scored({"val_loss": 2.0}) == {"val_loss": 2.0}
    assert validated(UNSCORED) is None and validated(None) is None and validated(2.0) == 2.0
    assert event_fields(scored({"val_loss": None, "epoch_done": True}), "/r/c", "/r")[
        "val_loss"] is None


def test_the_final_metrics_have_no_val_loss_and_no_best_checkpoint_without_validation():
    from training.driver import _final_fields

    cfg = SimpleNamespace(storage_path="/s", run_name="r")
    ck = SimpleNamespace(path="/s/r/checkpoint_epoch001_step0000010")
    result = SimpleNamespace(metrics={"epoch": 1, "val_loss": UNSCORED}, checkpoint=ck,
                             best_checkpoints=[(ck, {"val_loss": UNSCORED})])
    out = _final_fields(cfg, result)
    assert out["val_loss"] is None and "best_checkpoint" not in out
    result.metrics["val_loss"], result.best_checkpoints = 2.0, [(ck, {"val_loss": 2.0})]
    assert _final_fields(cfg, result)["best_checkpoint"] == ck.path
    # a run stopped by a limit: its last checkpoint is unvalidated, an earlier one is best
    stop = SimpleNamespace(path="/s/r/checkpoint_epoch001_step0000015")
    result.metrics["val_loss"], result.checkpoint = UNSCORED, stop
    result.best_checkpoints = [(stop, {"val_loss": UNSCORED}), (ck, {"val_loss": 2.0})]
    out = _final_fields(cfg, result)
    assert out["val_loss"] is None and out["best_checkpoint"] == ck.path


def test_no_validation_is_said_when_known():
    assert no_validation(None, "x") is None and no_validation(3, "x") is None
    line = no_validation(0, "corpus c holds 5 validation tokens")
    assert line.startswith("validation: none (corpus c holds 5 validation tokens)")
    assert "kept by recency" in line


def test_a_prepared_corpus_without_a_validation_split_says_so_before_ray(storage):
    from training.args import parse_args
    from training.driver import check_prepared, prepare_run

    make_corpus(pafs.LocalFileSystem(), str(storage / "corpora" / "c"), [BLOCK * 40],
                val=BLOCK - 1, block=BLOCK)
    argv = ["--name", "j", "--storage-path", str(storage), "--model", "tiny", "--tokenizer",
            "byte", "--block-size", str(BLOCK), "--data", "c", "--global-batch-size", "16"]
    cfg, _ = prepare_run(parse_args(argv, environ={}), environ={})
    prepared = check_prepared(cfg)
    assert prepared.no_val == no_validation(0, f"corpus c holds {BLOCK - 1} validation tokens, "
                                               f"no sequence of {BLOCK}")
    make_corpus(pafs.LocalFileSystem(), str(storage / "corpora" / "c"), [BLOCK * 40],
                val=BLOCK * 2, block=BLOCK)
    assert check_prepared(cfg).no_val is None
