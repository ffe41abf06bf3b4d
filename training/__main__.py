"""`python -m training [flags]`: the RayJob's entrypoint. Exit 0 done, 1 failed, 2 bad input."""

from __future__ import annotations

import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    from submitter.errors import SubmitterError
    from training import events as ev
    from training.args import parse_args

    try:
        cfg = parse_args(argv)
        from training.driver import run

        outcome = run(cfg, on_event=lambda e: print(ev.to_stdout_line(e), flush=True),
                      notice=lambda line: print(line, flush=True))
    except SubmitterError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
