"""submitter: distributed GPT-2 pre-training from a laptop to KubeRay, with durable checkpoints.

Kept import-light on purpose: `submitter --help` and `submitter render` must start fast, so
nothing here (or in spec/storage/render/plan) imports kubernetes, ray, torch or transformers.
"""

__version__ = "0.1.0"
