"""The status-event schema and its fold: what the entrypoint emits and `watch` reads."""

from __future__ import annotations

import pytest

from submitter.contract import events as ev


def test_make_event_validates_required_fields():
    with pytest.raises(ev.EventError):
        ev.make_event("progress", epoch=1)
    e = ev.make_event("checkpoint_saved", seq=3, epoch=1, path="/x")
    assert e["v"] == ev.SCHEMA_VERSION and e["seq"] == 3 and ev.parse_line(ev.to_stdout_line(e)) == e


def test_run_resumed_folds_into_the_state():
    state = ev.fold([ev.make_event("run_started", seq=1, run_name="j", num_workers=1,
                                   storage_path="/s"),
                     ev.make_event("run_resumed", seq=2, resumed_from="/s/j/ck", epoch=2, step=40)])
    assert (state.status, state.resumed_from, state.epoch, state.step) == ("running", "/s/j/ck", 2, 40)
    with pytest.raises(ev.EventError):
        ev.make_event("run_resumed", resumed_from="/s/j/ck")
