"""Kept for scripts written against the old place (e.g. the shared GPU reference step): the
FLOPs and peak table now live in the contract, where `submitter render` can use them too."""

from submitter.contract.flops import PEAK_RULES, Peak, device_words, flops_per_token, gpt2_parameters, mfu, peak_for  # noqa: F401
