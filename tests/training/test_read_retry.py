"""Reads that survive a flaky bucket (issue 37 item 8): transient errors (timeouts, 5xx,
throttling) are retried with jittered backoff, a budget spent ends in one line (exit 1, not
bad input), a missing or denied object is said at once. End to end through a proxy in front of
the local S3 server that answers a burst of requests with 503 SlowDown, longer than the SDK's
own retries."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.support.corpus import make_corpus
from tests.support.flaky_s3 import flaky_proxy
from tests.support.s3 import s3_server  # noqa: F401 - fixture
from training.data import retry
from training.data import shards as sh
from training.data.reader import open_corpus, open_manifest

BLOCK = 16


@pytest.mark.parametrize("error, transient", [
    (OSError("AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate."), True),
    (OSError("AWS Error UNKNOWN (HTTP status 503) during HeadObject operation"), True),
    (OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28, Timeout was reached"), True),
    (TimeoutError("read timed out"), True),
    (ConnectionResetError("Connection reset by peer"), True),
    (OSError("AWS Error ACCESS_DENIED during GetObject operation: Access Denied"), False),
    (FileNotFoundError("s3://b/x: no such key"), False),
    (OSError("shard of 512 tokens"), False),
    (ValueError("HTTP status 503"), False),  # not an I/O error: a bug, never retried
])
def test_which_errors_are_transient(error, transient):
    assert retry.is_transient(error) is transient


def test_retries_back_off_with_jitter_then_end_in_one_line():
    waits = []
    rng = random.Random(1)
    calls = iter([TimeoutError("t1"), OSError("HTTP status 503"), "bytes"])

    def flaky():
        got = next(calls)
        if isinstance(got, Exception):
            raise got
        return got

    assert retry.retrying(flaky, "reading x", sleep=waits.append, rng=rng) == "bytes"
    assert len(waits) == 2 and 0 <= waits[0] <= 0.2 and 0 <= waits[1] <= 0.4 and waits[0] != waits[1]
    bounds = [retry.backoff(k, random.Random(k)) for k in range(12)]
    assert all(0 <= b <= min(retry.CAP_S, retry.BASE_S * 2 ** k) for k, b in enumerate(bounds))

    def down():
        raise OSError("AWS Error SLOW_DOWN during GetObject operation: reduce your rate\nmore")

    with pytest.raises(retry.ReadFailed, match=r"^reading s3://b/x: 4 attempts over [\d.]+s failed "
                                               r"with transient errors \(last: AWS Error SLOW_DOWN") as e:
        retry.retrying(down, "reading s3://b/x", attempts=4, sleep=lambda s: None)
    assert e.value.exit_code == 1 and "\n" not in str(e.value)
    tried = []

    def missing():
        tried.append(1)
        raise FileNotFoundError("no such key")

    with pytest.raises(FileNotFoundError):
        retry.retrying(missing, "reading x", sleep=lambda s: None)
    assert tried == [1]  # said at once


def test_a_corpus_reads_whole_through_a_bucket_that_fails_bursts_of_requests(s3_server, monkeypatch):
    """Also: a bucket that is down at start is not bad input."""
    s3_server.make_bucket("corpora")
    make_corpus(s3_server.filesystem(), "corpora/c", [BLOCK * 40, BLOCK * 24], val=BLOCK * 12,
                block=BLOCK)
    monkeypatch.setattr(retry, "BASE_S", 0.01)  # the test's clock, not the policy
    upstream = s3_server.endpoint

    def read_all():
        _, _, manifest = open_manifest("s3://corpora/c", check=True)
        reader = open_corpus("s3://corpora/c", BLOCK, check=True, span=4)
        order = reader.order(seed=1, epoch=0)
        train = [b["input_ids"] for b in reader.batches(order, 0, 8, 0, 8, 4)]
        val = [b["input_ids"] for b in reader.val_batches(0, 1, 2)]
        reader.close()
        return manifest, np.concatenate(train), np.concatenate(val)

    # 40 requests in a row fail: longer than the SDK's own attempts (~30 over ~6 s)
    with flaky_proxy(upstream, ok=6, fail=40, once=True) as (address, proxy):
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{address}")
        proxy.on = False
        want = read_all()
        proxy.on, proxy.count = True, 0
        got = read_all()
        assert proxy.failed == 40
    assert got[0] == want[0] and np.array_equal(got[1], want[1]) and np.array_equal(got[2], want[2])
    assert len(got[1]) == 64 and len(got[2]) == 12
    # a bucket down at start: a failure to retry (exit 1), not bad input (exit 2)
    monkeypatch.setattr(retry, "ATTEMPTS", 1)  # the SDK's own attempts are slow enough
    with flaky_proxy(upstream, ok=0, fail=1) as (address, proxy):  # every request fails
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{address}")
        with pytest.raises(retry.ReadFailed, match="1 attempts over .* transient errors") as e:
            open_manifest("s3://corpora/c", check=True)
    assert e.value.exit_code == 1 and not isinstance(e.value, sh.CorpusError)
