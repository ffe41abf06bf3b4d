"""`python -m training`: the RayJob's entrypoint. Exit 0 done, or stopped by a limit
(--deadline, --max-cost: its checkpoint is saved, run_stopped says why; 0 so that KubeRay
neither retries the job nor starts a new cluster that would only be refused), 1 failed, 2 bad
input (or a run directory that is locked, holds another run, or is finished, or a limit already
spent), 130 Ctrl-C, 143 preempted (SIGTERM: the preemption checkpoint is registered; a retry
resumes from it).

`python -m training export NAME --storage-path P -o DIR` writes a run's model as a Hugging Face
directory (what `submitter export` runs).
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

EXIT_PREEMPTED = 143


def main(argv: Optional[Sequence[str]] = None) -> int:
    from submitter.contract import events as ev
    from submitter.contract.errors import SubmitterError
    from training.args import parse_args

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] == ["export"]:
            from training.driver import require_training_stack
            from training.gpt2.export import main as export_main

            require_training_stack()
            return export_main(args[1:])
        spec = parse_args(args)
        from training.driver import prepare_run, require_training_stack, run
        from training.run.preempt import Preempted

        require_training_stack(spec.dataset, spec.data)
        cfg, storage_line = prepare_run(spec)
        print(storage_line, flush=True)
        try:
            outcome = run(cfg, on_event=lambda e: print(ev.to_stdout_line(e), flush=True),
                          notice=lambda line: print(line, flush=True))
        except Preempted as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_PREEMPTED
    except SubmitterError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    return 0 if outcome.ok or outcome.state.status == "stopped" else 1


if __name__ == "__main__":
    sys.exit(main())
