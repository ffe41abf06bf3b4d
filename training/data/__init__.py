"""The data a run trains on: the corpus (a Hub dataset, files or a bucket of text, Parquet or
JSONL, the offline default), its tokenizers, and the Ray Data pipeline that streams token blocks
to the workers (`pipeline.py`).

Imports nothing else of `training`: the model, the run's storage and the events know the data
only as the token blocks (and their count) it hands over.
"""
