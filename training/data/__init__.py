"""The data a run trains on: the corpus (a Hub dataset, files or a bucket of text, Parquet or
JSONL, the offline default), its tokenizers, and its two paths to the workers:

- on the fly: the Ray Data pipeline that reads, tokenizes and streams token blocks every epoch
  (`pipeline.py`);
- prepared once (`prepare.py`) into token shards plus a manifest (`shards.py`), then read by
  position in the workers (`reader.py`), in an order computed from (seed, epoch) alone
  (`order.py`): a resume reads nothing before its position, a resize continues the sequence.

Imports nothing else of `training`: the model, the run's storage and the events know the data
only as the token blocks (and their count) it hands over.
"""
