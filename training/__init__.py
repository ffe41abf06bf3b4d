"""The GPT-2 pre-training entrypoint (`python -m training`) that runs inside the RayJob.

Light on import: the heavy modules (ray, torch, transformers) load inside the functions that
need them, so `--help`, argument errors and the event schema stay fast.
"""
