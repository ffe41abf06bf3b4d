"""The one error hierarchy of the project.

Every error a user can cause or meet carries the exit code the CLI returns and a one-line
message that says what is wrong and how to fix it. The CLI prints `str(error)` and exits; it
never shows a traceback for a `SubmitterError`.

`EXIT_CODES` is the one table of what each code means: `submitter --help`'s epilog and the
reliability page's table are generated from it, and each class below takes its code from it.
Why these numbers: 0, 1 and 2 are what a shell script expects (done, failed, usage); an API that
refuses a request (6-10) is never the job's outcome (1), so a script can tell "your job failed"
from "no such job" or "not allowed"; the codes stay small and consecutive, clear of 126-127
(the shell's own) and 128+N (killed by signal N: 130 is Ctrl-C, 143 SIGTERM).
"""

from __future__ import annotations

OK, JOB_FAILED, BAD_INPUT, WATCH_TIMEOUT, UNOBSERVABLE, STALLED = 0, 1, 2, 3, 4, 5
NOT_FOUND, FORBIDDEN, CONFLICT, NO_CRD, API_REFUSED = 6, 7, 8, 9, 10
INTERRUPTED = 130

#: Every exit code of the `submitter` commands and what it means (the one table; see above).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (OK, "done; for `watch`, the job succeeded (also when KubeRay's `ttlSecondsAfterFinished` "
         "already deleted the RayJob after success: it says so)"),
    (JOB_FAILED, "the job failed or was stopped (`watch`, `submit --watch`, `submit --local`, "
                 "`resume --watch`; also stopped with `submitter stop`, or deleted before it "
                 "ended; a job Kueue holds in a queue is waited for)"),
    (BAD_INPUT, "bad input: one line saying what is wrong and how to fix it; nothing applied "
                "or written (also a name taken by objects submitter did not create, a namespace "
                "that does not exist, an existing PVC that is not ReadWriteMany)"),
    (WATCH_TIMEOUT, "`watch --timeout` elapsed (the job keeps running)"),
    (UNOBSERVABLE, "the API could not be asked: unreachable, the credentials rejected (401), an "
                   "answer that is not Kubernetes' (an auth proxy's login page), or no answer "
                   "within `--request-timeout`; the job may be fine"),
    (STALLED, "`watch --stall-timeout` elapsed without training progress or a state change "
              "(the job is left alone)"),
    (NOT_FOUND, "not found: no such job, run or object in the namespace (HTTP 404)"),
    (FORBIDDEN, "forbidden: RBAC denies the verb on the resource (HTTP 403)"),
    (CONFLICT, "conflict: the object exists in a state this command must not change (HTTP 409, "
               "another owner, a different spec, a job that is not finished for `resume`)"),
    (NO_CRD, "the RayJob CRD is not installed: install the KubeRay operator"),
    (API_REFUSED, "the API refused the request otherwise (an invalid object: HTTP 400/422, an "
                  "unexpected status, an object stuck in deletion)"),
    (INTERRUPTED, "interrupted (Ctrl-C)"),
)


def exit_codes_markdown() -> str:
    """The table as Markdown (the reliability page, through the docs hook)."""
    return "\n".join(["| code | meaning |", "|---|---|",
                      *(f"| **{code}** | {meaning} |" for code, meaning in EXIT_CODES)])


class SubmitterError(Exception):
    """Base class: a failure the CLI reports as one line (exit code `exit_code`)."""

    exit_code = JOB_FAILED


# --- bad input: exit code 2, nothing applied or written ------------------------------------

class UsageError(SubmitterError):
    """The user's input (flags, job file, values) is invalid."""

    exit_code = BAD_INPUT


class SpecError(UsageError):
    """A JobSpec field has an invalid value."""


class OverBudget(UsageError):
    """`submit` refused before anything is applied: the estimate passes --max-cost or
    --deadline (#38)."""


class StoragePolicyError(UsageError):
    """The storage path would not survive the job (ephemeral, relative, outside the mount...)."""


# --- the cluster and the API: never 1, which is the job's failure -----------------------------

class ClusterError(SubmitterError):
    """Something the Kubernetes API or the cluster refused (exit 10 unless a subclass says
    more); raised by `submitter.kube` and the operations over it."""

    exit_code = API_REFUSED


class NotFound(ClusterError):
    """The object (or its namespace, or the run) does not exist."""

    exit_code = NOT_FOUND


class Conflict(ClusterError):
    """The object exists in a state that this operation must not change (HTTP 409 or a spec drift)."""

    exit_code = CONFLICT


class Forbidden(ClusterError):
    """RBAC denies a verb on a resource (HTTP 403)."""

    exit_code = FORBIDDEN


class Unobservable(ClusterError):
    """The API could not be asked about the job: unreachable, credentials rejected (401), or no
    answer within the deadline (`--request-timeout`). Nothing is known about the job, so this is
    not "the job failed" (1): scripts and CI can tell the two apart by exit code 4."""

    exit_code = UNOBSERVABLE


class ApiUnavailable(Unobservable):
    """The API server cannot be reached or keeps failing (5xx, 429, connection errors)."""


class Unauthorized(Unobservable):
    """The API server rejected the credentials (HTTP 401): an expired login, a revoked token."""


class ApiDeadline(Unobservable):
    """No answer within the command's deadline: a hung API server or a proxy that holds requests."""


class BadResponse(Unobservable):
    """The API answered something that is not a Kubernetes JSON response (an auth proxy's HTML
    login page with status 200, a truncated body): nothing was learnt about the job."""


class CrdMissing(ClusterError):
    """The RayJob CRD is not installed: the KubeRay operator is missing."""

    exit_code = NO_CRD


class Preflight(UsageError):
    """A precondition checked before any write failed (e.g. an existing PVC that is not RWX)."""


class WatchTimeout(SubmitterError):
    """`watch --timeout` elapsed before the job finished (the job is left alone)."""

    exit_code = WATCH_TIMEOUT


class JobFailed(SubmitterError):
    """The watched job ended FAILED or STOPPED."""

    exit_code = JOB_FAILED


class WatchStalled(SubmitterError):
    """`watch --stall-timeout` elapsed without training progress or a state change (the job is
    left alone)."""

    exit_code = STALLED
