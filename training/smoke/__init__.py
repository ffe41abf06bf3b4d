"""The GPU smoke run's parts (`python -m training.gpu_smoke` at the top is its command): the plan
sized by the card, the in-process timed steps, the nanoGPT-style reference model, the compiler
toolchain check.

A yardstick, not the job: nothing the job runs imports it (import-linter holds that).
"""
