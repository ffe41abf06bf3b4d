"""The `submitter` command line (click).

The job flags are generated from JobSpec's fields, so a field and its flag cannot drift apart;
every flag defaults to "not given" so a job file (`-f`) sets what the flags leave alone.
Heavy modules (kubernetes, ray, torch) are imported inside the commands that need them only:
`submitter --help` and `submitter render` must start fast.
"""

from __future__ import annotations

import dataclasses
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import click

from submitter import __version__
from submitter.cli_help import GroupedCommand
from submitter.cli_options import (NAMESPACE_HELP, OutputChoice, apply_options, cluster_options,
                                   context_namespace_options, kubeconfig_options,
                                   add_params, default_namespace, given_settings, job_option,
                                   refuse_local_dry_run, request_timeout, shown_default,
                                   spec_namespace, subcommand_context)
from submitter.contract.errors import SubmitterError, UsageError
from submitter.contract.spec import LOCAL_DEFAULTS, JobSpec, defaults, local_default_flags

_DEFAULTS = defaults()


# --- shared options ------------------------------------------------------------------------

def spec_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add `-f/--file` and one option per JobSpec field to a command.

    The Option objects are built once and shared by render, submit and init (an Option holds
    no per-command state): building ~70 of them per command was most of this module's import."""
    return add_params(func, _spec_params())


#: What a local default's note adds where the default depends on other flags.
_LOCAL_NOTES = {"name": ", with --script the script's (train.py: train)"}


@lru_cache(maxsize=1)
def _spec_params() -> tuple[click.Parameter, ...]:
    """The options in click's decorator order (click reverses them when it builds the command)."""
    def holder() -> None: ...

    func: Any = holder
    for f in reversed(dataclasses.fields(JobSpec)):
        default = _DEFAULTS[f.name]
        shown, help_ = shown_default(default), None
        if f.name == "namespace":  # its default depends on the command: the one rule, said once
            shown, help_ = "", NAMESPACE_HELP
        if LOCAL_DEFAULTS.get(f.name, default) != default:  # submit --local: a small job
            local = LOCAL_DEFAULTS[f.name]
            note = f"submit --local: {'none' if local is None else local}{_LOCAL_NOTES.get(f.name, '')}"
            shown = f"{shown[:-1]}; {note}]" if shown else f" [{note}]"
        func = job_option(f, shown, help_)(func)
    func = click.option("-f", "--file", "job_file", metavar="FILE",
                        help="job file (YAML, snake_case keys, `render -o jobfile` writes one), "
                             "a Helm values file, or `submitter render` output; flags override "
                             "it; - reads stdin")(func)
    return tuple(func.__click_params__)


def load_job_file(path: str | None) -> dict[str, Any]:
    """The settings of `-f FILE` (a job file, a values file or a rendered manifest stream)."""
    if path is None:
        return {}
    from submitter.jobfile import load

    return load(path)


def spec_values(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split command options into (job file values, flag overrides that were given)."""
    file_values = load_job_file(options.pop("job_file", None))
    flags = given_settings(options, [f.name for f in dataclasses.fields(JobSpec)])
    if "env" in flags and isinstance(file_values.get("env"), dict):
        flags["env"] = {**file_values["env"], **flags["env"]}
    return file_values, flags


def with_script_argv(options: dict[str, Any], argv: tuple[str, ...]) -> dict[str, Any]:
    """`-- ARGS...` after the flags: the --script's arguments (after any --script-args)."""
    if argv:
        options["script_args"] = (*(options.get("script_args") or ()), *argv)
    return options


def build_spec(options: dict[str, Any], context: str | None = None, kubeconfig: str | None = None,
               *, from_context: bool = False) -> JobSpec:
    """The job's spec. Without -n and a job-file namespace: `default`, unless `from_context`
    (submit; render and init with --namespace-from-context) or --context/--kubeconfig given,
    which read the kubeconfig context's (cli_options.spec_namespace, the one rule)."""
    file_values, flags = spec_values(options)
    return spec_of(file_values, flags, context, kubeconfig, from_context=from_context)


def spec_of(file_values: dict[str, Any], flags: dict[str, Any], context: str | None,
            kubeconfig: str | None, *, from_context: bool) -> JobSpec:
    """The spec of a job file's values and the flags given, in the namespace build_spec says."""
    given = "namespace" in flags or "namespace" in file_values  # one spelling in every key style
    namespace = spec_namespace(given, from_context, context, kubeconfig)
    if namespace is not None:
        flags["namespace"] = namespace
    return JobSpec.build(file_values, **flags)


# --- the group ------------------------------------------------------------------------------

#: Commands defined in `submitter.cli_cluster`, imported only when one of them runs (or for
#: `--help`): `submitter render` must not pay for them.
LAZY_COMMANDS = ("watch", "status", "list", "logs", "stop", "delete", "resume")


class _Group(click.Group):
    """Turns every SubmitterError into one line on stderr and its exit code (no tracebacks), and
    loads the cluster commands lazily."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS, "data"})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY_COMMANDS and name not in self.commands:
            from submitter import cli_cluster

            for command in cli_cluster.COMMANDS:
                self.add_command(command)
        if name == "data" and name not in self.commands:  # `data prepare`: submitter.cli_data
            from submitter.cli_data import data

            self.add_command(data)
        return super().get_command(ctx, name)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The exit-code table, built when help is shown (textwrap stays out of `render`)."""
        from submitter.cli_help import exit_codes_epilog

        self.epilog = self.epilog or exit_codes_epilog()
        super().format_epilog(ctx, formatter)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SubmitterError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(e.exit_code)
        except click.UsageError as e:  # click's own (unknown option, missing value): one line too
            where = (e.ctx or subcommand_context(self, ctx) or ctx).command_path
            message = " ".join(e.format_message().split())
            click.echo(f"error: {message} (see: {where} --help)", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


@click.group(cls=_Group,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="submitter")
def main() -> None:
    """Run GPT-2 pre-training on Kubernetes (KubeRay RayJob) or locally, with checkpoints that
    outlive the job.

    \b
    Examples:
      submitter submit --local                                   # the whole job, on this machine
      submitter render --name gpt2-demo --replicas 8 --gpu-per-pod 1 > job.yaml
      submitter submit --name gpt2-demo --replicas 8 --gpu-per-pod 1 --watch
      submitter watch gpt2-demo
    """


#: `render -o` values written to stdout; a directory is written as DIR/ (or --output-dir DIR).
RENDER_OUTPUTS = ("yaml", "json", "jobfile")


def render_target(output: str | None, output_dir: str | None, helm_values: bool) -> tuple[str, str | None]:
    """(kind, directory) of render's output: "yaml" | "json" | "jobfile" | "dir". Only the
    documented spellings: `-o yml` or `-o JSON` must not quietly become a directory."""
    def cut(text: str, limit: int) -> str:
        from submitter.jobfile import cut as cut_text

        return cut_text(text, limit)

    if output_dir is not None:
        if output is not None:
            raise UsageError(f"-o {cut(output, 40)} and --output-dir: give one of them")
        if not output_dir.strip():
            raise UsageError("--output-dir needs a directory name, e.g. --output-dir manifests-out")
        return "dir", output_dir
    output = "yaml" if output is None else output
    if output.endswith(("/", "\\")) and output.strip("/\\ "):
        return "dir", output
    if output not in RENDER_OUTPUTS:
        hint = {"yml": "yaml", "jobfile.yaml": "jobfile", "job": "jobfile"}.get(output.lower(), output.lower())
        fix = f"did you mean -o {hint}? " if hint in RENDER_OUTPUTS else ""
        raise UsageError(f"-o {cut(output, 40)} is not an output format; {fix}use yaml, json, "
                         "jobfile, or a directory written as DIR/ (or --output-dir DIR)")
    if helm_values and output != "yaml":
        raise UsageError(f"--helm-values prints a YAML values file; leave out -o {output}")
    return output, None


@main.command(cls=GroupedCommand)
@spec_options
@click.option("-o", "--output", default=None, metavar="yaml|json|jobfile|DIR/",
              help="yaml (default) or json: the objects to stdout; jobfile: a job file with every "
                   "setting and its help (read it back with -f); DIR/ (trailing slash): one file "
                   "per object plus a kustomization.yaml")
@click.option("--output-dir", metavar="DIR",
              help="write one file per object plus a kustomization.yaml into DIR (as -o DIR/)")
@click.option("--helm-values", is_flag=True,
              help="print a values file for charts/submitter instead of the objects")
@context_namespace_options
@click.argument("script_argv", nargs=-1, metavar="[-- SCRIPT_ARGS...]")
def render(output: str | None, output_dir: str | None, helm_values: bool,
           namespace_from_context: bool, kube_context: str | None, kubeconfig: str | None,
           script_argv: tuple[str, ...], **options: Any) -> None:
    """Render the job's Kubernetes objects (RayJob, PVC, RBAC) for GitOps; no cluster needed.

    -f reads a job file (snake_case keys), a Helm values file (camelCase keys) or the output of
    render itself, so `render ... > job.yaml` then `render -f job.yaml` gives the same objects.

    \b
    Examples:
      submitter render --name gpt2-demo --replicas 8 --gpu-per-pod 1 > job.yaml
      submitter render --name gpt2-demo --replicas 8 -o jobfile > job.yaml   # every setting, commented
      submitter render -f job.yaml --replicas 16                            # flags override the file
      submitter render --name gpt2-demo -o manifests-out/                   # or --output-dir DIR
      submitter render --name gpt2-demo --helm-values > values.yaml
      helm template gpt2-demo charts/submitter -f values.yaml
    """
    from submitter.render import render as render_plan  # what api.render wraps, lighter

    kind, directory = render_target(output, output_dir, helm_values)
    spec = build_spec(with_script_argv(options, script_argv), kube_context, kubeconfig,
                      from_context=namespace_from_context)
    plan = render_plan(spec)  # storage policy first: nothing is written when it refuses
    grace_warning(spec)
    if spec.script is None:  # what the run will take, one block (#38); never a refusal here
        from submitter.estimating import shown_block

        block = shown_block(spec, local=False, kubeconfig=kubeconfig)
        if block:
            click.echo(block, err=True)
    if spec.script is not None:
        from submitter.code_plan import storage_note

        note = storage_note(spec)
        if note:
            click.echo(note, err=True)
    if helm_values:
        from submitter.helm_code import helm_values, upload_line
        from submitter.plan import to_yaml

        click.echo(to_yaml(helm_values(spec), stream=False), nl=False)
        line = upload_line(spec)
        if line:
            click.echo(line, err=True)
    elif kind == "yaml":
        click.echo(str(plan), nl=False)
    elif kind == "json":
        click.echo(plan.to_json(), nl=False)
    elif kind == "jobfile":
        from submitter.jobfile import dump

        click.echo(dump(spec), nl=False)
    else:
        target = Path(str(directory))
        if target.exists() and not target.is_dir():
            raise UsageError(f"{target}: exists and is not a directory; choose another directory")
        written = plan.write_dir(target)
        click.echo(f"wrote {len(written)} files to {target}/", err=True)


@main.command(cls=GroupedCommand)
@spec_options
@click.argument("path", default="job.yaml", metavar="[FILE]")
@click.option("--force", is_flag=True, help="overwrite FILE if it exists")
@context_namespace_options
def init(path: str, force: bool, namespace_from_context: bool, kube_context: str | None,
         kubeconfig: str | None, **options: Any) -> None:
    """Write a job file (default: job.yaml) with every setting, its help and its default, for
    the flags given; `render -f FILE` / `submit -f FILE` read it back to the same job.

    \b
    Examples:
      submitter init --name gpt2-demo --replicas 8 --gpu-per-pod 1      # writes job.yaml
      submitter init --name gpt2-demo gpt2-demo.yaml
      submitter init -f old.yaml --epochs 4 new.yaml                    # an edited copy
      submitter init --name gpt2-demo -                                 # to stdout
    """
    import os

    from submitter.jobfile import dump

    spec = build_spec(options, kube_context, kubeconfig, from_context=namespace_from_context)
    render_plan_checked(spec)
    text = dump(spec)
    if path == "-":
        click.echo(text, nl=False)
        return
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError:
        raise UsageError(f"{path} exists; choose another FILE or add --force to overwrite it") from None
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    click.echo(f"wrote {path}: edit it, then: submitter submit -f {path}", err=True)


def grace_warning(spec: JobSpec) -> None:
    """Warn (stderr) when a step on --gpu-type's card plus the preemption checkpoint outlast
    the grace period (submitter.contract.step_time)."""
    from submitter.contract.step_time import grace_warning as warning_for
    from submitter.render import PRESTOP_MARGIN

    warning = warning_for(spec, PRESTOP_MARGIN)
    if warning:
        click.echo(f"warning: {warning}", err=True)


def render_plan_checked(spec: JobSpec) -> None:
    """Apply render's checks (the storage policy) so a job file that cannot render is not written."""
    from submitter.api import render as render_plan

    render_plan(spec)


@main.command(cls=GroupedCommand)
@spec_options
@cluster_options
@click.option("--local", is_flag=True,
              help="run the pod's command (python -m training) here, on an embedded Ray with "
                   "CPU workers = --replicas, instead of on a cluster (needs submitter-gpt2[train]); "
                   "what flags and -f leave unset is then a small CPU job: "
                   f"{local_default_flags()}, --storage-path ./runs (the run's first line "
                   "says which of these it took)")
@apply_options
@click.argument("script_argv", nargs=-1, metavar="[-- SCRIPT_ARGS...]")
def submit(local: bool, dry_run: str, watch_after: bool, output: str, kube_context: str | None,
           kubeconfig: str | None, script_argv: tuple[str, ...], **options: Any) -> None:
    """Submit the job: apply its RayJob, PVC and RBAC to the cluster, or run it with --local.

    \b
    Examples:
      submitter submit --local                          # the demo, on this machine (CPU)
      submitter submit --name gpt2-demo --replicas 8 --gpu-per-pod 1
      submitter submit --name gpt2-demo --dry-run=client -o yaml
      submitter submit -f job.yaml --watch
      submitter submit --name my-run --script train.py -- --lr 3e-4   # your own Ray Train script
    """
    options = with_script_argv(options, script_argv)
    refuse_local_dry_run("submit", local, dry_run)
    if local:
        from submitter.local import run_local

        file_values, flags = spec_values(options)
        sys.exit(run_local(file_values, flags, output=output))
    from submitter import api

    spec = build_spec(options, kube_context, kubeconfig, from_context=True)  # kubectl's rule
    sys.exit(api.submit(spec, dry_run=dry_run, watch=watch_after, output=output,
                        context=kube_context, kubeconfig=kubeconfig,
                        request_timeout=request_timeout(), out=sys.stdout,
                        err=sys.stderr).exit_code)


# --- estimate (#38): what the run will take, before it starts -------------------------------

#: The job name an estimate uses when none is given (a name changes no figure).
UNNAMED = "estimate"


def estimate_spec(options: dict[str, Any], local: bool, context: str | None,
                  kubeconfig: str | None) -> Any:
    """The job as `submit` (or `submit --local`) would run it; --name may be left out."""
    from submitter.contract.spec import normalize_keys

    file_values, flags = spec_values(options)
    if "name" not in flags and not normalize_keys(file_values).get("name"):
        flags["name"] = UNNAMED
    if local:
        from submitter.local import local_spec, local_storage_path

        return local_spec(file_values, flags, local_storage_path(file_values, flags))
    return spec_of(file_values, flags, context, kubeconfig, from_context=True)


@main.command(cls=GroupedCommand)
@spec_options
@click.option("--local", is_flag=True,
              help="estimate the run `submit --local` makes (CPU workers on this machine): its "
                   "hours come from your finished local runs' measured tokens/s")
@click.option("-o", "--output", type=OutputChoice(["text", "json"]), default="text",
              help="text (default) or json: tokens, steps, hours, gpu_hours, cost (likely), "
                   "low and high, and sources")
@kubeconfig_options
@click.argument("script_argv", nargs=-1, metavar="[-- SCRIPT_ARGS...]")
def estimate(local: bool, output: str, kube_context: str | None, kubeconfig: str | None,
             script_argv: tuple[str, ...], **options: Any) -> None:
    """Estimate a run before it starts: tokens per epoch and in all, the global batch, optimizer
    steps, step time, wall-clock, GPU-hours and cost, each likely with its low-high range, and
    where every input came from. Takes the flags and job file of `submit`.

    The MFU comes from your newest finished run of the same model and card on the same storage,
    else the project's measured table, else a stated default; prices from --gpu-hour-price or
    submitter-prices.yaml beside your kubeconfig (no built-in prices). See docs/estimating.md.

    \b
    Examples:
      submitter estimate --replicas 8 --gpu-per-pod 1 --gpu-type H100 --data fineweb10b
      submitter estimate -f job.yaml --gpu-hour-price 2.49 -o json
      submitter estimate --local --data my-corpus
    """
    import json

    from submitter.contract.estimate import text_block
    from submitter.estimating import estimate_for

    spec = estimate_spec(with_script_argv(options, script_argv), local, kube_context, kubeconfig)
    est = estimate_for(spec, local=local, kubeconfig=kubeconfig)
    if output == "json":
        click.echo(json.dumps(est.to_dict(), indent=2))
    else:
        click.echo(text_block(est))


def _complete_job_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    from submitter.cli_cluster import complete_job_names

    return complete_job_names(ctx, param, incomplete)


@main.command()
@click.argument("name", shell_complete=_complete_job_names)
@click.option("--storage-path", metavar="PATH",
              help="read the run from its directory under this storage path (a local run, a "
                   "mounted PVC, or s3://, gs://, abfss://... as submit writes them); without it, "
                   "from the cluster job's progress ConfigMap")
@click.option("-n", "--namespace", default=None, help=NAMESPACE_HELP)
@cluster_options
@click.option("--output-dir", default=".", show_default=True, metavar="DIR",
              help="where NAME-report.png and NAME-report.html are written")
def report(name: str, storage_path: str | None, namespace: str | None, output_dir: str,
           kube_context: str | None, kubeconfig: str | None) -> None:
    """Draw a run: train and validation loss against step, tokens/s, restarts and checkpoints
    marked, as a PNG and a self-contained HTML page (with the run's settings and final metrics).

    Needs matplotlib: pip install "submitter-gpt2[report]".

    \b
    Examples:
      submitter report gpt2-local --storage-path runs        # a `submit --local` run
      submitter report gpt2-demo -n team-a                   # a cluster job (its ConfigMap)
      submitter report gpt2-demo -n team-a --storage-path s3://bucket/runs   # its events.jsonl
      submitter report gpt2-demo --output-dir reports/
    """
    from submitter import api
    from submitter.report import need_matplotlib

    JobSpec.build(name=name)  # the name is checked like everywhere else (exit 2)
    need_matplotlib()  # before reading anything: exit 2 with the pip command
    if namespace is None and storage_path is None:
        namespace = default_namespace(kube_context, kubeconfig)
    written = api.report(name, storage_path=storage_path, namespace=namespace or _DEFAULTS["namespace"],
                         out_dir=output_dir, context=kube_context, kubeconfig=kubeconfig)
    click.echo(f"wrote {written.png} and {written.html}")
    for line in written.took:  # what the run took beside its estimate (#38)
        click.echo(line)


@main.command()
@click.argument("name", shell_complete=_complete_job_names)
@click.option("--storage-path", metavar="PATH",
              help="the run's storage path: a bucket URI or a PVC path [default: ./runs, a "
                   "`submit --local` run]")
@click.option("-n", "--namespace", default=None,
              help="namespace of a cluster run: its files are in <storage>/<namespace>/<name>")
@click.option("--port", default=6006, show_default=True, type=click.IntRange(1, 65535))
@click.option("--print", "print_only", is_flag=True, help="print the command, do not run it")
def tensorboard(name: str, storage_path: str | None, namespace: str | None, port: int,
                print_only: bool) -> None:
    """Serve a run's TensorBoard curves (loss, val loss, LR, tokens/s, data wait, grad norm,
    workers; the settings as text and hparams). Every run writes them to <run>/tensorboard/.

    A local run or a bucket is served from here with `tensorboard --logdir`; a run on a PVC
    gets the two kubectl lines that serve it from the job's head pod.

    \b
    Examples:
      submitter tensorboard gpt2-local                              # ./runs/gpt2-local
      submitter tensorboard gpt2-demo -n team-a --storage-path s3://bucket/runs
      submitter tensorboard gpt2-demo -n team-a --storage-path /mnt/checkpoints --print
    """
    import os
    import shutil

    from submitter.tensorboard_cmd import PIP_LINE, board

    JobSpec.build(name=name)  # the name is checked like everywhere else (exit 2)
    plan = board(name, storage_path, namespace, port, os.getcwd())
    if print_only or plan.argv is None:
        click.echo("\n".join(plan.lines))
        return
    if shutil.which("tensorboard") is None:
        click.echo(plan.lines[0])
        raise UsageError(f"tensorboard is not installed here: {PIP_LINE}")
    click.echo(f"serving {plan.logdir} on http://localhost:{port}/", err=True)
    os.execvp(plan.argv[0], plan.argv)


@main.command()
@click.argument("name")
@click.option("--storage-path", required=True, help="the run's storage path (a directory)")
@click.option("-n", "--namespace", default=None,
              help="namespace of a cluster run: its directory is <storage>/<namespace>/<name>")
@click.option("--checkpoint", default=None, help="a checkpoint directory [default: the latest]")
@click.option("-o", "--output", required=True, help="new or empty directory to write")
def export(name: str, storage_path: str, namespace: str | None, checkpoint: str | None,
           output: str) -> None:
    """Write a run's model as a Hugging Face directory (GPT2LMHeadModel.from_pretrained).

    \b
    Examples:
      submitter export gpt2-local --storage-path ./runs -o gpt2-local-hf
      submitter export gpt2-demo -n team --storage-path /mnt/checkpoints -o out/
    """
    from submitter.local import run_export

    sys.exit(run_export(name, storage_path, output, namespace=namespace, checkpoint=checkpoint))
