"""The one error hierarchy of the project.

Every error a user can cause or meet carries the exit code the CLI returns and a one-line
message that says what is wrong and how to fix it. The CLI prints `str(error)` and exits; it
never shows a traceback for a `SubmitterError`.
"""

from __future__ import annotations


class SubmitterError(Exception):
    """Base class: a failure the CLI reports as one line (exit code `exit_code`)."""

    exit_code = 1


# --- bad input: exit code 2, nothing applied or written ------------------------------------

class UsageError(SubmitterError):
    """The user's input (flags, job file, values) is invalid."""

    exit_code = 2


class SpecError(UsageError):
    """A JobSpec field has an invalid value."""


class StoragePolicyError(UsageError):
    """The storage path would not survive the job (ephemeral, relative, outside the mount...)."""


# --- the cluster and the API: exit code 1 ---------------------------------------------------

class ClusterError(SubmitterError):
    """Something the Kubernetes API or the cluster said; raised by `submitter.kube` only."""


class NotFound(ClusterError):
    """The object (or its namespace, or its CRD) does not exist."""


class Conflict(ClusterError):
    """The object exists in a state that this operation must not change (HTTP 409 or a spec drift)."""


class Forbidden(ClusterError):
    """RBAC denies a verb on a resource (HTTP 403)."""


class Unobservable(ClusterError):
    """The API could not be asked about the job: unreachable, credentials rejected (401), or no
    answer within the deadline (`--request-timeout`). Nothing is known about the job, so this is
    not "the job failed" (1): scripts and CI can tell the two apart by exit code 4."""

    exit_code = 4


class ApiUnavailable(Unobservable):
    """The API server cannot be reached or keeps failing (5xx, 429, connection errors)."""


class Unauthorized(Unobservable):
    """The API server rejected the credentials (HTTP 401): an expired login, a revoked token."""


class ApiDeadline(Unobservable):
    """No answer within the command's deadline: a hung API server or a proxy that holds requests."""


class BadResponse(ClusterError):
    """The API answered something that is not a Kubernetes JSON response (an auth proxy's HTML
    login page with status 200, a truncated body)."""


class CrdMissing(ClusterError):
    """The RayJob CRD is not installed: the KubeRay operator is missing."""


class Preflight(UsageError):
    """A precondition checked before any write failed (e.g. an existing PVC that is not RWX)."""


class WatchTimeout(SubmitterError):
    """`watch --timeout` elapsed before the job finished (the job is left alone)."""

    exit_code = 3


class JobFailed(SubmitterError):
    """The watched job ended FAILED or STOPPED."""

    exit_code = 1


class WatchStalled(SubmitterError):
    """`watch --stall-timeout` elapsed without training progress or a state change (the job is
    left alone)."""

    exit_code = 5
