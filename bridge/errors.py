"""Every failure bridge reports is a BridgeError; provider exceptions are translated where they enter.

Each class says the exit code ``mcbridge`` ends with when it stops a command (``exit_code``: 2 for
bad input, 1 for what went wrong at run time, 130/143 for a job stopped by Ctrl-C/SIGTERM); the
CLI takes its codes from here and nowhere else (bridge.cli.main, tests/test_cli_errors.py).

    BridgeError                    exit 1
     ├── UsageError                 exit 2: bad input from the user
     │    ├── BadURL                malformed URL or unknown scheme
     │    ├── InvalidOption         an option value that cannot work
     │    │    └── PolicyError      a policy file with mistakes, each in ``problems`` (file, line,
     │    │                         field); defined in bridge.policies.replication
     │    └── RouteUnavailable      a route cannot serve this job (pair, names, missing settings);
     │                              found before any request, so another route can take the job
     ├── MissingBackend             the extra for a scheme is not installed
     ├── NotFound
     │    ├── BucketNotFound        bucket or container does not exist
     │    └── ObjectNotFound        source object or prefix does not exist
     ├── AuthError
     │    ├── CredentialsMissing    no credentials could be found
     │    ├── PermissionDenied      credentials were rejected (never retried)
     │    └── ClockSkewed           the signature's time is too far from the service's (never retried)
     ├── TransientError             worth retrying: throttling, 5xx, resets, timeouts
     │    └── EndpointUnreachable   nothing answered at the endpoint
     ├── IntegrityError             bytes do not match their recorded hash (never retried)
     ├── ManifestError              no manifest, or one that cannot be read
     ├── UnsafeName                 a name the destination cannot hold as written, or one that would
     │    │                         land outside it (.., absolute, empty segment, NUL, a backslash to Azure)
     │    └── UnsafeMember          a shard member that must not be unpacked (absolute, .., link)
     ├── MetadataError              headers or metadata the destination cannot hold, with no reversible mapping
     ├── Archived                   source objects in an archive class: unreadable until restored
     ├── Unsupported                the store answers that it does not do this (501, NotImplemented)
     ├── CopySourceUnreadable       the store could not read the URL it was to copy from
     ├── OverBudget                 a job's estimate is above its --max-cost (refused before it runs)
     ├── JobCancelled               exit 130: the job was cancelled (Ctrl-C) and its remote transfer with it
     │    └── JobTerminated         exit 143: the same, by SIGTERM
     ├── TransferFailed             a job ended with failed units
     │    ├── StoreDown             every recent request to one store failed the same way: the job stopped
     │    └── RouteFailed           a cloud's transfer service refused or failed the job; ``moved_data``
     │                              says whether it may have written anything (if not, ``direct`` can run it)
     └── CheckFailed                a check ran and did not prove everything; ``result`` holds what it found
          ├── VerifyFailed          copies missing, extra, mismatched or unproven against their record
          ├── TreesDiffer           two trees compared without records are not equal
          └── ReplicationFailed     a policy's checkpoints did not reach the copies it asks for

The original provider exception is kept as ``__cause__``.
"""

from __future__ import annotations


class BridgeError(Exception):
    exit_code: int = 1


class Unsupported(BridgeError):
    """The store (or emulator) answered that it does not implement the request."""


class CopySourceUnreadable(BridgeError):
    """The store could not read the source URL of a copy (Azure CannotVerifyCopySource)."""


class UsageError(BridgeError):
    exit_code = 2


class BadURL(UsageError):
    pass


class InvalidOption(UsageError):
    pass


class MissingBackend(BridgeError):
    pass


class NotFound(BridgeError):
    pass


class BucketNotFound(NotFound):
    pass


class ObjectNotFound(NotFound):
    pass


class AuthError(BridgeError):
    pass


class CredentialsMissing(AuthError):
    pass


class PermissionDenied(AuthError):
    pass


class ClockSkewed(AuthError):
    pass


class TransientError(BridgeError):
    pass


class EndpointUnreachable(TransientError):
    pass


class IntegrityError(BridgeError):
    pass


class ManifestError(BridgeError):
    pass


class UnsafeName(BridgeError):
    """A name refused before any byte moves: it would escape a local destination, or the
    destination would store it under another name (and the copy would then not verify)."""


class UnsafeMember(UnsafeName):
    """A shard holds a member that must not be restored: absolute, climbing out, a link or device."""


class MetadataError(BridgeError):
    """Metadata a destination cannot hold as given, and that has no reversible mapping there
    (bridge/attributes.py): the file fails rather than lose it."""


class Archived(BridgeError):
    """Source objects in an archive class (S3 Glacier / Deep Archive, Azure Archive), refused
    before any byte moves: unreadable until restored."""


class OverBudget(BridgeError):
    pass


class TransferFailed(BridgeError):
    pass


class StoreDown(TransferFailed):
    """A job's breaker tripped (bridge.retry.Breaker): its requests are not sent any more."""


class RouteUnavailable(UsageError):
    pass


class JobCancelled(BridgeError):
    exit_code = 130


class JobTerminated(JobCancelled):
    """Stopped by SIGTERM (as a scheduler stops a job): the shell's code for it, 128 + 15."""
    exit_code = 143


class RouteFailed(TransferFailed):
    def __init__(self, message: str, *, moved_data: bool):
        super().__init__(message)
        self.moved_data = moved_data


class CheckFailed(BridgeError):
    """A check that ran and found something it could not prove; ``result`` is what it found
    (bridge.api's VerifyResult, CheckResult or ReplicateResult)."""

    def __init__(self, message: str, result: object = None):
        super().__init__(message)
        self.result = result


class VerifyFailed(CheckFailed):
    pass


class TreesDiffer(CheckFailed):
    pass


class ReplicationFailed(CheckFailed):
    pass


RETRYABLE: tuple[type[BaseException], ...] = (TransientError,)
