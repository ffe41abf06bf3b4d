"""The scaling model's formulas (benchmarks/scaling_model.py, #18 item 6): ring all-reduce,
DDP's bucket overlap, the step and the efficiency table. Pure arithmetic: no GPU, no torch."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

import pytest

from tests.conftest import ROOT
from submitter.contract.flops import flops_per_token, gpt2_parameters


def _load():
    spec = importlib.util.spec_from_file_location("scaling_model", ROOT / "benchmarks" / "scaling_model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["scaling_model"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


sm = _load()
S = sm.Settings()


def test_ring_all_reduce_time():
    assert sm.ring_allreduce_s(1e9, 1, 1e9, 1e-5) == 0.0  # nothing to reduce alone
    # n = 2: each rank sends and receives half, twice: S / bandwidth, plus 2 latencies
    assert sm.ring_allreduce_s(1e9, 2, 1e9, 1e-5) == pytest.approx(1.0 + 2e-5)
    # large n: the bandwidth term tends to 2 S / bandwidth, the latency grows with n
    assert sm.ring_allreduce_s(1e9, 512, 1e9, 0) == pytest.approx(2 * 511 / 512)
    assert sm.ring_allreduce_s(0, 512, 1e9, 1e-5) == pytest.approx(2 * 511 * 1e-5)


def test_buckets_split_the_gradients_like_ddp():
    assert sm.bucket_sizes(60, 25) == [25, 25, 10]
    assert sm.bucket_sizes(50, 25) == [25, 25]
    # DDP sizes buckets in fp32 gradient bytes: a 50 MiB cap is 25 MiB of bf16 on the wire
    from training.gpt2.comm import BUCKET_CAP_MB

    assert S.bucket_cap_mb == BUCKET_CAP_MB and S.bucket_bytes == BUCKET_CAP_MB * 2**20 // 2
    # the tied embedding (50,304 x 768 in bf16) is not in DDP's buckets: its own all-reduce
    assert S.tied_bytes == 50304 * 768 * 2
    rest = sm.bucket_sizes(S.grad_bytes - S.tied_bytes, S.bucket_bytes)
    assert sum(rest) + S.tied_bytes == S.grad_bytes and len(rest) == 7  # 171 MB in 26 MB buckets


def test_the_tied_gradients_all_reduce_starts_when_the_backward_ends():
    """Ready only after the embedding's backward: its whole all-reduce shows, after whatever
    bucket is still in flight."""
    assert sm.exposed_comm_s([], 1.0, 0.3) == pytest.approx(0.3)
    assert sm.exposed_comm_s([0.1] * 4, 1.0, 0.3) == pytest.approx(0.1 + 0.3)  # last bucket, then it
    assert sm.exposed_comm_s([0.5] * 4, 1.0, 0.3) == pytest.approx(2.0 - 0.75 + 0.3)
    x = sm.step(S, 8, 100)
    tied = sm.ring_allreduce_s(S.tied_bytes, 8, 100e9 / 8, S.latency_us / 1e6)
    assert x.tied_tail_s == pytest.approx(tied)  # the buckets alone finish inside the backward
    assert x.tied_tail_s > 0.5 * x.exposed_comm_s  # the tail is most of what shows at 8 x 100


def test_the_micro_batch_is_the_batch_rules_for_the_card():
    from submitter.contract import batch

    for gpu in ("H100", "T4", "H200"):
        s = dataclasses.replace(S, gpu_type=gpu)
        memory = batch.gpu_memory_gib(gpu)
        assert s.micro_tokens == batch.micro_batch_that_fits("gpt2-small", S.block, memory) * S.block
    assert dataclasses.replace(S, micro_batch_tokens=4096).micro_tokens == 4096  # an override


@pytest.mark.parametrize("k, bucket, backward", [(10, 0.001, 1.0), (10, 0.5, 1.0), (4, 0.25, 1.0),
                                                 (1, 0.3, 1.0), (7, 0.02, 0.1)])
def test_only_the_last_bucket_shows_unless_communication_is_slower_than_the_backward(k, bucket,
                                                                                     backward):
    exposed = sm.exposed_comm_s([bucket] * k, backward)
    closed_form = max(bucket, k * bucket - backward * (k - 1) / k)
    assert exposed == pytest.approx(closed_form)
    assert bucket * (1 - 1e-9) <= exposed <= k * bucket * (1 + 1e-9)  # one bucket to all of them


def test_flops_per_token_and_parameters_of_gpt2_small():
    params = gpt2_parameters(50257, 1024)
    assert params == 124_439_808  # GPT-2 small with tied embeddings and 1024 positions
    assert flops_per_token(params, 12, 768, 1024) == 6 * params + 12 * 12 * 768 * 1024
    assert S.grad_bytes == 2 * S.params


def test_the_parameter_formula_is_the_models():
    from training.gpt2.model import expected_parameters, padded_vocab

    for vocab, block in ((50257, 256), (50257, 1024)):
        assert expected_parameters("gpt2-small", vocab, block) == gpt2_parameters(padded_vocab(vocab), block)
    assert S.vocab == padded_vocab(50257)  # the model trains with the padded embedding


def test_one_gpu_is_the_baseline_and_has_no_communication():
    one = sm.step(S, 1, 25)
    assert one.exposed_comm_s == one.comm_s == 0.0
    assert one.micro_batches == S.global_batch_tokens // S.micro_tokens
    assert sm.efficiency(S, 1, 25) == pytest.approx(1.0)
    # compute = tokens x FLOPs per token / (peak x MFU) when micro-batches are large
    assert one.compute_s == pytest.approx(S.global_batch_tokens * S.per_token / (S.peak_tflops * 1e12 * S.mfu))


def test_efficiency_falls_with_gpus_and_rises_with_bandwidth():
    for b in sm.BANDWIDTHS_GBPS:
        effs = [sm.efficiency(S, n, b) for n in sm.GPUS]
        assert effs == sorted(effs, reverse=True) and 0 < effs[-1] < effs[0] == pytest.approx(1)
    for n in sm.GPUS[1:]:
        effs = [sm.efficiency(S, n, b) for b in sm.BANDWIDTHS_GBPS]
        assert effs == sorted(effs)
    # and more MFU on the same network makes communication matter more
    faster = dataclasses.replace(S, mfu=0.6)
    assert sm.efficiency(faster, 8, 25) < sm.efficiency(S, 8, 25)


def test_eight_gpus_overlap_the_buckets_at_100_gbps_and_show_the_tied_tail():
    """The headline layout: 8 one-GPU pods, 0.5 M tokens per step, one all-reduce per step."""
    x = sm.step(S, 8, 100)
    assert x.micro_batches == S.global_batch_tokens // 8 // S.micro_tokens
    assert x.exposed_comm_s < 0.15 * x.total_s
    assert sm.efficiency(S, 8, 400) > sm.efficiency(S, 8, 100) > 0.85 > sm.efficiency(S, 8, 25)


def test_512_gpus_break_on_the_micro_batch_and_the_notes_say_so():
    x = sm.step(S, 512, 400)
    assert x.tokens_per_gpu == 1024 and x.micro_batches == 1 and x.launch_bound
    notes = sm.breaks(S)
    assert any(n.startswith("512 GPUs:") and "only 1,024 tokens" in n and "too small" in n for n in notes)
    assert not any(n.startswith("8 GPUs at 400") for n in notes)


def test_a_global_batch_smaller_than_a_sequence_per_gpu_is_named():
    small = dataclasses.replace(S, global_batch_tokens=2**16)  # 128 tokens each on 512
    assert any("less than one sequence" in n for n in sm.breaks(small))


def test_the_report_is_a_table_of_every_gpu_count_and_bandwidth():
    text = sm.report(S)
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split("|")[1].strip() for r in rows] == ["1", "8", "64", "512"]
    assert all(r.count("%") == 3 for r in rows)
    assert rows[0].endswith("| 100% | 100% | 100% |")
    assert "Where it breaks:" in text


def test_flags_override_the_settings():
    s = sm.parse_args(["--mfu", "0.25", "--block", "1024", "--latency-us", "30"])
    assert (s.mfu, s.block, s.latency_us, s.vocab) == (0.25, 1024, 30.0, 50304)
    assert sm.parse_args(["--gpu-type", "T4", "--bucket-cap-mb", "25"]).gpu_type == "T4"


def test_the_docs_page_carries_the_models_current_table():
    """docs/gpus/multi-node.md shows the default table; after changing the model, paste the
    table that `python benchmarks/scaling_model.py` prints."""
    page = (ROOT / "docs" / "gpus" / "multi-node.md").read_text()
    assert sm.format_table(sm.table(S)) in page
