"""`submitter estimate` and the budget guards (#38, before the run): exact tokens from a prepared
corpus's manifest, the MFU source order, prices, `-o json`, bad flags, and `--max-cost` /
`--deadline` refusing before anything is applied (the API emulator) or written (--local)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from submitter.cli import main
from submitter.contract import estimate as E
from submitter.contract import naming
from submitter.contract.spec import JobSpec
from submitter.contract.step_time import ASSUMED_MFU
from submitter.contract.usage import USAGE_FILE, RunUsage
from submitter.estimating import estimate_for
from tests.conftest import ROOT
from tests.support.kube_emulator import RAYJOBS

GPU = ["--replicas", "8", "--gpu-per-pod", "1"]
#: Training shards with tails that are not whole sequences (the reader drops each tail).
SHARDS = [100_000_100, 99_999_999, 51_234_567]


def write_corpus(root: Path, shards=SHARDS) -> Path:
    corpus = root / "corpora" / "fw"
    corpus.mkdir(parents=True)
    entries = [{"file": "val-000000.bin", "split": "val", "tokens": 7_000_000}]
    entries += [{"file": f"train-{i:06d}.bin", "split": "train", "tokens": t}
                for i, t in enumerate(shards)]
    (corpus / "manifest.json").write_text(json.dumps(
        {"format": "submitter-corpus", "version": 1, "name": "fw", "shards": entries}))
    return corpus


def usage(name: str, *, model="gpt2-small", gpu_type="H100 SXM", kind="shared-mount", gpus=8,
          mfu=0.5, tokens_per_s=1e6, finished=True, at="2026-11-20T10:00:00Z",
          workers=None) -> RunUsage:
    return RunUsage(model=model, gpu_type=gpu_type, storage_kind=kind, workers=workers or max(gpus, 1),
                    gpus=gpus, tokens=10**9, wall_s=3600.0, gpu_hours=8.0, restarts=0,
                    tokens_per_s=tokens_per_s, mfu=mfu, finished=finished, stopped_by=None,
                    finished_at=at, cost=None, name=name)


def write_usage(storage: Path, run: RunUsage, folder: str | None = None) -> None:
    where = storage / (folder or run.name)
    where.mkdir(parents=True, exist_ok=True)
    (where / USAGE_FILE).write_text(run.to_json())


# --- tokens and steps --------------------------------------------------------------------------

def test_a_prepared_corpus_is_counted_exactly_from_its_manifest(tmp_path):
    corpus = write_corpus(tmp_path)
    spec = JobSpec.build(name="e", data=str(corpus / "manifest.json"), gpu_type="H100", epochs=3,
                         replicas="8", gpu_per_pod=1)
    est = estimate_for(spec, local=False, environ={})
    block = spec.block
    sequences = sum(t // block for t in SHARDS)  # per shard, not of the sum
    assert sequences != sum(SHARDS) // block
    global_batch = spec.batch_plan().global_batch
    assert est.tokens_exact and est.tokens_per_epoch == sequences * block
    assert est.steps_per_epoch == sequences // global_batch
    d = est.to_dict()
    assert d["steps"] == 3 * (sequences // global_batch)
    assert d["tokens"] == d["steps"] * global_batch * block
    # exact: the range of tokens and steps is none; the hours still have one
    assert d["low"]["tokens"] == d["tokens"] == d["high"]["tokens"]
    assert d["low"]["hours"] < d["hours"] < d["high"]["hours"]
    assert d["sources"]["tokens"].startswith("exact:") and str(corpus) in d["sources"]["tokens"]
    capped = estimate_for(JobSpec.build(name="e", data=str(corpus), gpu_type="H100", replicas="8",
                                        gpu_per_pod=1, max_steps_per_epoch=100), local=False,
                          environ={})
    assert capped.to_dict()["steps"] == 2 * 100


def test_files_read_on_the_fly_are_estimated_and_marked_so(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_bytes(b"x" * 40_000_000)
    est = estimate_for(JobSpec.build(name="e", data=str(text), gpu_type="L4", replicas="8",
                                     gpu_per_pod=1), local=False, environ={}).to_dict()
    assert est["tokens_exact"] is False and est["sources"]["tokens"].startswith("estimated")
    assert est["low"]["tokens"] < est["tokens"] < est["high"]["tokens"]
    assert est["low"]["steps"] <= est["steps"] <= est["high"]["steps"]


def test_an_unknown_size_gives_no_hours_and_says_how_to_get_them():
    est = estimate_for(JobSpec.build(name="e", gpu_type="H100", replicas="8", gpu_per_pod=1),
                       local=False, environ={})
    d = est.to_dict()
    assert d["tokens"] is None and d["hours"] is None and d["cost"] is None
    assert "submitter data prepare" in d["sources"]["tokens"]
    assert "the token count is unknown" in E.text_block(est)


# --- the MFU: own runs, then the measured table, then the default ------------------------------

def test_the_mfu_comes_from_own_runs_then_the_measured_table_then_the_default():
    per_token, peak = 7.7e8, 989.0
    own = [usage("mine-old", mfu=0.30, at="2026-11-01T00:00:00Z")]
    newest = usage("mine-new", mfu=0.45, gpus=1, at="2026-11-25T00:00:00Z")
    ignored = [usage("other-model", model="tiny"), usage("other-store", kind="object-store"),
               usage("unfinished", finished=False), usage("other-card", gpu_type="L4")]
    pace = E.choose_mfu("gpt2-small", "H100 SXM", "shared-mount", [*ignored, newest, *own],
                        per_token, peak)
    assert (pace.origin, pace.value) == ("own", 0.45)
    assert "mine-new" in pace.source and "2026-11-25" in pace.source
    measured = E.choose_mfu("gpt2-small", "H200 SXM", "shared-mount", ignored, per_token, peak)
    assert (measured.origin, measured.value) == ("measured", 0.417)
    assert "smoke" in measured.source and "2026-11-27" in measured.source
    assumed = E.choose_mfu("gpt2-small", "H100 SXM", "shared-mount", ignored, per_token, peak)
    assert (assumed.origin, assumed.value) == ("assumed", ASSUMED_MFU)
    assert "ASSUMED_MFU" in assumed.source
    # an own run without an MFU: its tokens/s over the peak
    no_mfu = usage("paced", mfu=None, gpus=1, tokens_per_s=0.4 * peak * 1e12 / per_token)
    assert E.choose_mfu("gpt2-small", "H100 SXM", "shared-mount", [no_mfu], per_token,
                        peak).value == pytest.approx(0.4)


def test_the_measured_table_is_the_smoke_runs_page():
    page = (ROOT / "docs" / "gpus" / "smoke-run.md").read_text()
    for (model, card), (mfu, where) in E.MEASURED_MFU.items():
        assert f"{mfu:.1%}" in page and "2026-11-27" in page and "docs/gpus/smoke-run.md" in where


def test_an_own_run_on_the_storage_is_read_and_brought_back_to_one_gpu(tmp_path):
    storage = tmp_path / "store"
    write_usage(storage / "team", usage("big-run", mfu=0.40, gpus=8))  # <storage>/<ns>/<name>
    spec = JobSpec.build(name="e", gpu_type="NVIDIA-H100-80GB-HBM3", replicas="8", gpu_per_pod=1,
                         storage_path=str(storage), max_steps_per_epoch=50)
    est = estimate_for(spec, local=False, environ={})
    assert "big-run" in est.sources["pace"]
    assert est.mfu > 0.40  # the 8-GPU job's MFU holds its all-reduce: one GPU's is higher
    # on 8 GPUs again, the step runs at about the run's own MFU
    achieved = est.tokens_per_step * E.scaling_settings(
        "gpt2-small", spec.block, est.tokens_per_step, 1, E.peak_for("H100"), 0.4, None).per_token \
        / est.likely.step_s / (8 * 989e12)
    assert achieved == pytest.approx(0.40, rel=0.05)


def test_a_local_run_has_hours_only_from_own_measured_runs(storage):
    spec_args = dict(name="e", model="tiny", storage_path=str(storage), max_steps_per_epoch=10,
                     replicas="2")
    est = estimate_for(JobSpec.build(**spec_args), local=True, environ={})
    assert est.likely.steps == 20 and est.likely.hours is None
    assert "no finished CPU run" in est.sources["pace"]
    write_usage(storage, usage("gpt2-local", model="tiny", gpu_type=None, kind="local", gpus=0,
                               workers=2, mfu=None, tokens_per_s=2000.0))
    est = estimate_for(JobSpec.build(**spec_args), local=True, environ={})
    train_s = 20 * est.tokens_per_step / 2000.0  # two workers then, two now
    assert est.likely.hours * 3600 == pytest.approx(
        train_s + E.STARTUP_S["local"]["likely"] + est.likely.checkpoint_s)
    assert "gpt2-local" in est.sources["pace"] and est.likely.gpu_hours == 0


# --- prices ------------------------------------------------------------------------------------

def test_prices_come_from_the_flag_else_the_table_beside_the_kubeconfig(tmp_path):
    kubeconfig = tmp_path / "config"
    (tmp_path / "submitter-prices.yaml").write_text("NVIDIA-H100-80GB-HBM3: 2.5\nL4: 0.7\n")
    args = dict(name="e", gpu_type="H100", replicas="8", gpu_per_pod=1, max_steps_per_epoch=100)
    est = estimate_for(JobSpec.build(**args), local=False, kubeconfig=str(kubeconfig), environ={})
    assert est.price.per_hour == 2.5 and "submitter-prices.yaml" in est.price.source
    assert est.likely.cost == pytest.approx(est.likely.gpu_hours * 2.5)
    flagged = estimate_for(JobSpec.build(**args, gpu_hour_price=4.0), local=False,
                           kubeconfig=str(kubeconfig), environ={})
    assert flagged.price.per_hour == 4.0
    # $KUBECONFIG's first file decides where the table is; none there: no price, and it says how
    none = estimate_for(JobSpec.build(**args), local=False,
                        environ={"KUBECONFIG": str(tmp_path / "elsewhere" / "kc")})
    assert none.price is None and none.likely.cost is None
    assert "--gpu-hour-price" in none.sources["price"]


def test_a_malformed_price_table_is_one_line(tmp_path, runner):
    (tmp_path / "submitter-prices.yaml").write_text("H100: cheap\n")
    result = runner.invoke(main, ["estimate", *GPU, "--gpu-type", "H100",
                                  "--kubeconfig", str(tmp_path / "config")])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "not a price" in result.stderr


# --- the command -------------------------------------------------------------------------------

def test_estimate_json_has_the_likely_figures_low_high_and_sources(tmp_path, runner):
    corpus = write_corpus(tmp_path)
    result = runner.invoke(main, ["estimate", *GPU, "--gpu-type", "H100", "--data", str(corpus),
                                  "--gpu-hour-price", "2", "-o", "json",
                                  "--kubeconfig", str(tmp_path / "kc")])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    for case in (d, d["low"], d["high"]):
        assert set(E.FIGURES) <= set(case) and all(case[k] is not None for k in E.FIGURES)
    assert set(d["low"]) == set(d["high"]) == set(E.FIGURES)
    assert d["low"]["cost"] < d["cost"] < d["high"]["cost"]
    assert d["cost"] == pytest.approx(d["gpu_hours"] * 2, abs=0.01)
    assert {"tokens", "pace", "peak", "scaling", "startup", "checkpoints", "preemptions",
            "price"} <= set(d["sources"])
    no_price = json.loads(runner.invoke(main, ["estimate", *GPU, "--gpu-type", "H100", "--data",
                                               str(corpus), "-o", "json", "--kubeconfig",
                                               str(tmp_path / "kc")]).stdout)
    assert no_price["cost"] is None and no_price["low"]["cost"] is None
    assert no_price["hours"] == d["hours"]
    text = runner.invoke(main, ["estimate", *GPU, "--gpu-type", "H100", "--data", str(corpus),
                                "--kubeconfig", str(tmp_path / "kc")]).stdout
    assert "no price: " in text and "--gpu-hour-price" in text


@pytest.mark.parametrize("args, says", [
    (["--deadline", "90"], "--deadline"), (["--deadline", "12 hours"], "--deadline"),
    (["--deadline", "0s"], "--deadline"), (["--max-cost", "-5"], "--max-cost"),
    (["--max-cost", "ten"], "--max-cost"), (["--gpu-hour-price", "0"], "--gpu-hour-price"),
    (["--gpu-hour-price", "x"], "--gpu-hour-price"), (["-o", "yaml"], "-o yaml"),
    ([*GPU, "--gpu-type", "Z9000"], "H100 SXM"), (GPU, "--gpu-type"),
])
def test_bad_values_are_one_line_exit_2(runner, storage, args, says):
    for command in (["estimate"], ["submit", "--local", "--storage-path", str(storage)]):
        if command[0] == "submit" and args[0] in ("-o", "--replicas"):
            continue  # submit's -o and a card are checked elsewhere
        result = runner.invoke(main, [*command, *args])
        assert result.exit_code == 2, (command, args, result.output)
        assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
        assert says in result.stderr and "Traceback" not in result.stderr


def test_estimate_imports_no_torch_ray_or_kubernetes(tmp_path):
    corpus = write_corpus(tmp_path)
    code = ("import sys; from submitter.cli import main\n"
            "try:\n    main(['estimate', '--replicas', '8', '--gpu-per-pod', '1', '--gpu-type', "
            f"'H100', '--data', {str(corpus)!r}])\nexcept SystemExit: pass\n"
            "print('HEAVY', sorted(m for m in ('torch', 'ray', 'kubernetes', 'pyarrow') "
            "if m in sys.modules), file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert "HEAVY []" in proc.stderr, proc.stderr
    assert "exact" in proc.stdout


def test_render_shows_the_estimate_on_stderr_only(runner, tmp_path):
    result = runner.invoke(main, ["render", "--name", "e", *GPU, "--gpu-type", "H100",
                                  "--max-steps-per-epoch", "100"])
    assert result.exit_code == 0 and "kind: RayJob" in result.stdout
    assert "estimate (likely" not in result.stdout and "estimate (likely" in result.stderr
    assert naming.ESTIMATE_ANNOTATION not in result.stdout  # render stays pure


# --- the guards --------------------------------------------------------------------------------

def test_max_cost_below_the_estimate_refuses_with_nothing_applied(api, kubeconfig, runner):
    job = ["submit", "--name", "budget", "--kubeconfig", kubeconfig, *GPU, "--gpu-type", "H100",
           "--max-steps-per-epoch", "1000", "--gpu-hour-price", "2"]
    mark = len(api.emulator.requests_since(0))
    refused = runner.invoke(main, [*job, "--max-cost", "0.5"])
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.count("\n") == 1 and "--max-cost 0.5" in refused.stderr
    assert "likely cost" in refused.stderr and "nothing was applied" in refused.stderr
    assert api.emulator.requests_since(mark) == []  # not even a read
    late = runner.invoke(main, [*job, "--deadline", "1m"])
    assert late.exit_code == 2 and "longer than --deadline 1m" in late.stderr
    assert api.emulator.get(RAYJOBS, "default", "budget") is None
    # a client dry run shows the block on stderr and prints render's objects, unannotated
    dry = runner.invoke(main, [*job, "--dry-run=client"])
    assert dry.exit_code == 0 and "estimate (likely" in dry.stderr
    assert "kind: RayJob" in dry.stdout and naming.ESTIMATE_ANNOTATION not in dry.stdout
    # within budget: applied, the likely estimate recorded on the RayJob for watch and status
    ok = runner.invoke(main, [*job, "--max-cost", "100000", "--deadline", "48h"])
    assert ok.exit_code == 0, ok.output
    rayjob = api.emulator.get(RAYJOBS, "default", "budget")
    recorded = json.loads(rayjob["metadata"]["annotations"][naming.ESTIMATE_ANNOTATION])
    assert recorded["steps"] == 2 * 1000 and recorded["cost"] < 100000
    assert set(E.FIGURES) <= set(recorded) and "sources" in recorded


def test_a_limit_that_cannot_be_checked_needs_a_price_or_says_so(api, kubeconfig, runner):
    job = ["submit", "--name", "budget", "--kubeconfig", kubeconfig, *GPU, "--gpu-type", "H100",
           "--max-steps-per-epoch", "1000"]
    no_price = runner.invoke(main, [*job, "--max-cost", "50"])
    assert no_price.exit_code == 2 and "no price to compare with" in no_price.stderr
    no_card = runner.invoke(main, [*job[:-4], "--max-cost", "50", "--gpu-hour-price", "2"])
    assert no_card.exit_code == 2 and "--gpu-type" in no_card.stderr
    assert api.emulator.get(RAYJOBS, "default", "budget") is None


def test_local_limits_below_the_estimate_write_nothing(storage, runner, monkeypatch):
    from submitter import local

    def ran(*args, **kwargs):
        raise AssertionError("the local run started")

    monkeypatch.setattr(local, "follow_child", ran)
    write_usage(storage, usage("earlier", model="tiny", gpu_type=None, kind="local", gpus=0,
                               mfu=None, tokens_per_s=5000.0))
    before = sorted(p.relative_to(storage) for p in storage.rglob("*"))
    base = ["submit", "--local", "--storage-path", str(storage)]
    refused = runner.invoke(main, [*base, "--gpu-hour-price", "1", "--max-cost", "0.001"])
    assert refused.exit_code == 2 and "--max-cost 0.001" in refused.stderr, refused.output
    late = runner.invoke(main, [*base, "--deadline", "5s"])
    assert late.exit_code == 2 and "--deadline 5s" in late.stderr, late.output
    assert sorted(p.relative_to(storage) for p in storage.rglob("*")) == before
    # what estimate --local says of the same run: the earlier run's pace, the local start-up
    shown = json.loads(runner.invoke(main, ["estimate", "--local", "--storage-path", str(storage),
                                            "-o", "json"]).stdout)
    assert shown["steps"] == 2 * 120 and shown["hours"] > 0 and shown["gpu_hours"] == 0
    assert "earlier" in shown["sources"]["pace"]


def test_a_local_run_passes_its_estimate_to_run_json(storage, runner, monkeypatch):
    from submitter import local
    from training.run.identity import estimate_extra, record

    seen = {}

    def ran(spec, storage_path, view, command=None, env_extra=None):
        seen.update(env_extra or {})
        return local.LocalOutcome(True, local.ev.ProgressState(status="finished"), storage_path,
                                  None, 0)

    monkeypatch.setattr(local, "follow_child", ran)
    monkeypatch.setattr(local, "require_training_stack", lambda *what: None)
    result = runner.invoke(main, ["submit", "--local", "--storage-path", str(storage)])
    assert result.exit_code == 0, result.output
    estimate = json.loads(seen[naming.ENV_ESTIMATE])
    assert estimate["steps"] == 2 * 120 and estimate["hours"] is None  # no run measured yet
    kept = record({"name": "x"}, {}, extra=estimate_extra(seen))
    assert kept[naming.RUN_ESTIMATE_KEY] == estimate and kept["job"] == {"name": "x"}
    assert estimate_extra({naming.ENV_ESTIMATE: "{broken"}) == {}


def test_limits_on_a_script_job_are_refused_not_silently_ignored(runner, tmp_path):
    """A user's own --script is neither estimated nor stopped by the run at a limit: a
    --deadline there would promise what nothing checks (one line, exit 2, nothing written)."""
    from submitter.cli import main

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    for limit in (["--deadline", "1h"], ["--max-cost", "5", "--gpu-hour-price", "1"]):
        result = runner.invoke(main, ["render", "--name", "mine", "--script", str(script), *limit])
        assert result.exit_code == 2, result.output
        assert "not for your own --script" in result.stderr and "Traceback" not in result.output
        assert result.stdout == ""


def test_a_price_from_the_table_reaches_the_run_that_checks_max_cost(api, kubeconfig, runner,
                                                                      tmp_path, monkeypatch):
    """The pod has neither the kubeconfig nor the table beside it: a --max-cost job carries the
    price its guard used in the job document, so the run can stop at the limit."""
    from pathlib import Path

    (Path(kubeconfig).parent / "submitter-prices.yaml").write_text("H100: 2.5\n")
    job = ["submit", "--name", "priced", "--kubeconfig", kubeconfig, *GPU, "--gpu-type", "H100",
           "--max-steps-per-epoch", "1000", "--max-cost", "100000"]
    ok = runner.invoke(main, job)
    assert ok.exit_code == 0, ok.output
    head = api.emulator.get(RAYJOBS, "default", "priced")["spec"]["rayClusterSpec"][
        "headGroupSpec"]["template"]["spec"]["containers"][0]
    document = json.loads(next(e["value"] for e in head["env"] if e["name"] == naming.ENV_JOB))
    assert document["gpuHourPrice"] == 2.5 and document["maxCost"] == 100000


def test_a_mixture_is_counted_from_every_corpus_manifest(tmp_path):
    """A mixture's epoch is as many sequences as its corpora hold together (whatever the
    weights): exact when every manifest is readable, unknown (and why) when one is not."""
    write_corpus(tmp_path)
    other = tmp_path / "corpora" / "st"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps({"format": "submitter-corpus", "version": 1,
        "name": "st", "shards": [{"file": "train-000000.bin", "split": "train", "tokens": 5_000_000}]}))
    spec = JobSpec.build(name="e", data="fw:0.7,st:0.3", storage_path=str(tmp_path))
    est = estimate_for(spec, local=True, environ={})
    block = spec.block
    assert est.tokens_exact
    assert est.tokens_per_epoch == (sum(t // block for t in SHARDS) + 5_000_000 // block) * block
    assert "the mixture's 2 corpora (fw, st)" in est.to_dict()["sources"]["tokens"]
    missing = estimate_for(JobSpec.build(name="e", data="fw:1,nope:1", storage_path=str(tmp_path)),
                           local=True, environ={})
    assert missing.tokens_per_epoch is None and "corpora/nope" in missing.to_dict()["sources"]["tokens"]


def test_without_a_price_it_says_the_key_this_run_is_priced_by():
    from submitter import prices

    assert E.price_key(True) == prices.LOCAL_KEY  # the contract cannot import the table's reader
    assert E.price_key(False) == "CARD"
