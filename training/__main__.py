"""`python -m training`: the RayJob's entrypoint. Exit 0 done, 1 failed, 2 bad input, 130 Ctrl-C."""

from __future__ import annotations

import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    from submitter.contract import events as ev
    from submitter.contract.errors import SubmitterError
    from training.args import parse_args

    try:
        spec = parse_args(argv)
        from training.driver import prepare_run, require_training_stack, run

        require_training_stack()
        cfg, storage_line = prepare_run(spec)
        print(storage_line, flush=True)
        outcome = run(cfg, on_event=lambda e: print(ev.to_stdout_line(e), flush=True),
                      notice=lambda line: print(line, flush=True))
    except SubmitterError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
