"""A model that leaves: a checkpoint -> a Hugging Face directory, and a short sample of its text.

The directory holds `config.json` + `model.safetensors` (what `GPT2LMHeadModel.from_pretrained`
loads) and the tokenizer: `tokenizer_info.json` always (kind, vocabulary, end-of-text id), plus
the tiktoken ranks file for a GPT-2 BPE built from one (`gpt2.tiktoken`). The exported model has
exactly the tokenizer's vocabulary: rows a trainer padded the embedding with (for speed) are
sliced off, so its logits are the vocabulary's and nothing else.

`python -m training export NAME --storage-path P -o DIR` (what `submitter export` runs as a
child process, so the CLI never imports torch) exports a run's latest complete checkpoint (one
Ray Train registered: never a torn upload); the driver
exports `<run>/model` at the end of every run and puts the sample into `run_finished`.

The sample shows what the model learned: its prompt is the start of a row of the run's own
training data, and it is drawn with a temperature and top-k, as people sample a language model.
Greedy decoding of a small model falls into a loop at once ('The the the ...') and says nothing
about it. A fixed seed keeps a sample repeatable for the same weights.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
from typing import Any, Callable, Mapping, Optional, Sequence

from submitter.contract.errors import NotFound, UsageError
from training.run.checkpoint_io import STATE_FILE, load_state

#: The prompt of a sample when the run's data gives none, and how many tokens a sample adds.
SAMPLE_PROMPT = "The "
SAMPLE_TOKENS = 48
#: nanoGPT's sample.py defaults (temperature 0.8, top-k 200; 40 suits a 257-token byte vocab too).
SAMPLE_TEMPERATURE = 0.8
SAMPLE_TOP_K = 40
SAMPLE_SEED = 0
#: A prompt taken from the data is at most this long, cut at a space.
PROMPT_CHARS = 40
EXPORT_DIR = "model"
TOKENIZER_INFO = "tokenizer_info.json"
_CKPT = re.compile(r"^checkpoint_epoch(\d+)_step(\d+)$")
#: Ray Train's run snapshot in the run directory: the checkpoints it registered.
SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"


# --- which checkpoint --------------------------------------------------------------------------

def registered_checkpoints(run_dir: str) -> Optional[set[str]]:
    """The checkpoints Ray Train registered (its run snapshot: what a resume would use), by
    directory name; None when the run has no snapshot (nothing was ever registered). A
    checkpoint directory that is not among them is torn or unfinished: a kill during its
    upload leaves a `state.pt` that may be cut short."""
    path = os.path.join(run_dir, SNAPSHOT_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read {path} ({e}); it says which checkpoints are complete. "
                         "Pass --checkpoint DIR to export one you know is") from None
    results = [*(data.get("checkpoint_results") or []), data.get("latest_checkpoint_result")]
    return {r["checkpoint_dir_name"] for r in results if r and r.get("checkpoint_dir_name")}


def latest_checkpoint(run_dir: str, notice: Callable[[str], None] = print) -> str:
    """The newest complete checkpoint of a run (highest step, then epoch): registered by Ray
    Train (registered_checkpoints) and with a state. Newer ones that are not registered are
    skipped, and `notice` says so in one line."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        raise NotFound(f"no run at {run_dir}; check the name, --storage-path and --namespace") from None
    found = []
    for name in names:
        m = _CKPT.match(name)
        if m and os.path.exists(os.path.join(run_dir, name, STATE_FILE)):
            found.append(((int(m.group(2)), int(m.group(1))), name))
    registered = registered_checkpoints(run_dir) or set()
    complete = [c for c in found if c[1] in registered]
    best = max(complete) if complete else None
    torn = sorted(name for key, name in found if name not in registered
                  and (best is None or key > best[0]))
    if torn:
        notice(f"skipping {', '.join(torn)}: not registered by Ray Train (an upload cut short, "
               f"e.g. by a kill); {'using ' + best[1] if best else 'no complete one is left'}")
    if best is None:
        raise UsageError(f"{run_dir} has no complete checkpoint yet; train it first (submitter "
                         "submit), or resume it so the next checkpoint completes")
    return os.path.join(run_dir, best[1])


def check_registered(checkpoint_dir: str) -> None:
    """A checkpoint named with --checkpoint: refused when its run's snapshot exists and does
    not list it (torn); a directory outside a run (a copy) is taken as it is."""
    run_dir, name = os.path.split(checkpoint_dir.rstrip("/"))
    registered = registered_checkpoints(run_dir)
    if registered is not None and name not in registered:
        raise UsageError(f"{checkpoint_dir} was never registered by Ray Train (its upload was "
                         "cut short, so its state may be torn); leave out --checkpoint for the "
                         "latest complete one")


def tokenizer_of(run_record: Optional[Mapping[str, Any]], model_config: Mapping[str, Any]) -> dict[str, Any]:
    """What the run trained with: from its run.json, else inferred from the vocabulary size."""
    ident = (run_record or {}).get("identity") or {}
    job = (run_record or {}).get("job") or {}
    # a padded embedding (a multiple of 64 rows) keeps the tokenizer's size in its config
    vocab = (ident.get("vocab_size") or model_config.get("tokenizer_vocab_size")
             or model_config["vocab_size"])
    kind = ident.get("tokenizer") or ("byte" if vocab <= 257 else "gpt2")
    return {"kind": kind, "vocab_size": int(vocab), "bpe_file": job.get("bpe_file"),
            "eot_token_id": model_config.get("eos_token_id")}


# --- the model ------------------------------------------------------------------------------------

def hf_model(state: Mapping[str, Any], vocab_size: Optional[int] = None):
    """A GPT2LMHeadModel with the checkpoint's weights and exactly `vocab_size` token rows."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = dict(state["model_config"])
    weights = {k.removeprefix("module.").removeprefix("_orig_mod."): v
               for k, v in state["model"].items()}
    padded = weights["transformer.wte.weight"].shape[0]
    vocab = vocab_size or padded
    if vocab > padded:
        raise UsageError(f"the checkpoint has {padded} token rows, fewer than the tokenizer's {vocab}")
    for key in ("transformer.wte.weight", "lm_head.weight"):
        if key in weights:
            weights[key] = weights[key][:vocab].clone()
    cfg.update(vocab_size=vocab, use_cache=True)
    if "tokenizer_vocab_size" in cfg:
        cfg["tokenizer_vocab_size"] = vocab
    config = GPT2Config.from_dict(cfg)
    model = GPT2LMHeadModel(config)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if k != "lm_head.weight" and not k.endswith(".attn.bias")]
    if missing or unexpected:
        raise ValueError(f"the checkpoint does not fit GPT-2: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    model.tie_weights()
    model.eval()
    return model


def encoding_for(tok: Mapping[str, Any]):
    from training.data.tokens import TokenizerSpec, get_encoding

    spec = (TokenizerSpec("bpe-file", tok["bpe_file"]) if tok["kind"] == "bpe-file"
            else TokenizerSpec(tok["kind"]))
    return get_encoding(spec)


def prompt_from(rows: Sequence[str], fallback: str = SAMPLE_PROMPT) -> str:
    """The start of the first training row with a few words in it (whitespace runs folded,
    cut after a space), so the sample continues text of the kind the model was trained on."""
    for row in rows:
        text = " ".join(str(row).split())
        if len(text) < 12 or " " not in text[:PROMPT_CHARS]:
            continue
        return text[:PROMPT_CHARS].rsplit(" ", 1)[0] + " " if len(text) > PROMPT_CHARS else text + " "
    return fallback


def sample_text(model, encoding, prompt: str = SAMPLE_PROMPT, tokens: int = SAMPLE_TOKENS,
                temperature: float = SAMPLE_TEMPERATURE, top_k: int = SAMPLE_TOP_K,
                seed: int = SAMPLE_SEED) -> str:
    """The prompt and up to `tokens` tokens drawn from the model's distribution at `temperature`
    among the `top_k` likeliest (the same seed, the same weights: the same text), decoded
    (bytes that do not form UTF-8 show as U+FFFD). Stops at end-of-text."""
    import torch

    ids = list(encoding.encode_ordinary(prompt))
    block = model.config.n_positions
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(tokens):
            x = torch.tensor([ids[-block:]], dtype=torch.long)
            # a training model's padded rows are no tokens: only the vocabulary's logits count
            logits = model(input_ids=x).logits[0, -1, :encoding.n_vocab].float() / max(temperature, 1e-6)
            if top_k and top_k < logits.numel():
                kth = torch.topk(logits, top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            token = int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator))
            if token == encoding.eot_token:
                break
            ids.append(token)
    return encoding.decode_bytes(ids).decode("utf-8", errors="replace")


def write_hf_dir(model, tok: Mapping[str, Any], out_dir: str, source: str) -> None:
    """config.json, model.safetensors and the tokenizer files into out_dir."""
    from transformers.utils import logging as hf_logging

    os.makedirs(out_dir, exist_ok=True)
    hf_logging.disable_progress_bar()  # a "Writing model shards" bar is noise in a job's log
    model.save_pretrained(out_dir, safe_serialization=True)
    info = {"kind": tok["kind"], "vocab_size": tok["vocab_size"],
            "eot_token_id": tok["eot_token_id"], "eot_token": "<|endoftext|>",
            "source_checkpoint": source}
    if tok["kind"] == "byte":
        info["note"] = ("byte-level: token i < 256 is the byte i, 256 is <|endoftext|>; "
                        "decode with bytes(ids).decode('utf-8', 'replace')")
    elif tok["kind"] == "bpe-file" and tok.get("bpe_file") and os.path.exists(tok["bpe_file"]):
        shutil.copyfile(tok["bpe_file"], os.path.join(out_dir, "gpt2.tiktoken"))
        info["tiktoken_ranks_file"] = "gpt2.tiktoken"
        info["note"] = "the GPT-2 BPE: tiktoken.Encoding(name='gpt2', pat_str=r50k, ranks of gpt2.tiktoken)"
    else:
        info["tiktoken_encoding"] = "gpt2"
        info["note"] = "the GPT-2 BPE: tiktoken.get_encoding('gpt2')"
    with open(os.path.join(out_dir, TOKENIZER_INFO), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2, sort_keys=True)
        f.write("\n")


def export_checkpoint(checkpoint_dir: str, out_dir: str,
                      run_record: Optional[Mapping[str, Any]] = None,
                      prompt: str = SAMPLE_PROMPT) -> dict[str, Any]:
    """Export one checkpoint; returns {"export_dir", "sample_prompt", "sample", "checkpoint"}."""
    state = load_state(checkpoint_dir)
    tok = tokenizer_of(run_record, state["model_config"])
    model = hf_model(state, tok["vocab_size"])
    write_hf_dir(model, tok, out_dir, checkpoint_dir)
    try:
        sample = sample_text(model, encoding_for(tok), prompt)
    except Exception as e:  # noqa: BLE001 - a tokenizer that cannot load here costs the sample only
        sample = f"(no sample: {type(e).__name__})"
    return {"export_dir": out_dir, "sample_prompt": prompt, "sample": sample,
            "checkpoint": checkpoint_dir}


def export_run_end(checkpoint: Any, target: str, run_record: Optional[Mapping[str, Any]],
                   prompt: str = SAMPLE_PROMPT) -> dict[str, Any]:
    """The driver's end-of-run export of a Ray Checkpoint into `target` (a path or URI), its
    sample continuing `prompt` (taken from the run's data)."""
    import tempfile

    from training.run.identity import is_local

    with checkpoint.as_directory() as d:
        if is_local(target):
            return export_checkpoint(d, target, run_record, prompt)
        with tempfile.TemporaryDirectory() as tmp:
            out = export_checkpoint(d, tmp, run_record, prompt)
            import pyarrow.fs as pafs

            pafs.copy_files(tmp, target)
            return {**out, "export_dir": target}


# --- `python -m training export` ------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        raise UsageError(f"{message} (see python -m training export --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m training export",
                description="Write a run's latest checkpoint as a Hugging Face GPT-2 directory "
                            "(config.json, model.safetensors, tokenizer info) and print a sample.")
    p.add_argument("name", help="the run (job) name")
    p.add_argument("--storage-path", required=True, help="the run's storage path (a directory)")
    p.add_argument("-n", "--namespace", default=None,
                   help="the namespace of a cluster run (its directory is <storage>/<ns>/<name>)")
    p.add_argument("--checkpoint", default=None, help="a checkpoint directory (default: the latest)")
    p.add_argument("-o", "--output", required=True, help="directory to write (new or empty)")
    return p


def main(argv: Sequence[str]) -> int:
    from training.run.identity import RUN_FILE, read_json

    ns = build_parser().parse_args(list(argv))
    storage = ns.storage_path
    if "://" in storage and not storage.startswith("file://"):
        raise UsageError("export reads a run on a mounted directory; copy an object-store run "
                         "down first (e.g. aws s3 sync) and pass that directory")
    storage = storage.removeprefix("file://")
    run_dir = os.path.join(os.path.abspath(storage), *([ns.namespace] if ns.namespace else []), ns.name)
    ckpt = os.path.abspath(ns.checkpoint) if ns.checkpoint else latest_checkpoint(run_dir)
    if not os.path.exists(os.path.join(ckpt, STATE_FILE)):
        raise UsageError(f"{ckpt} is not a checkpoint (no {STATE_FILE})")
    check_registered(ckpt)
    out = os.path.abspath(ns.output)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise UsageError(f"-o {ns.output} exists and is not an empty directory; pick a new one")
    result = export_checkpoint(ckpt, out, read_json(os.path.join(run_dir, RUN_FILE)))
    print(f"exported {ckpt} to {out} (GPT2LMHeadModel.from_pretrained({out!r}))", flush=True)
    print(f"sample: {result['sample']!r}", flush=True)
    return 0
