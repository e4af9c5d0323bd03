"""One error hierarchy for the plugin: every error a user can cause says *what* went wrong, *where*
(a path, file:line, shard id or operator) and *what to do next*; the CLI and the ``dj-process`` hook
print an :class:`ElasticError` as one line with exit code 2, never a traceback.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable, Sequence
from typing import Any, Final

EXIT_OK: Final = 0
EXIT_INCOMPLETE: Final = 1  # `dj-elastic status`: the job is not finished yet
EXIT_ERROR: Final = 2  # bad input, bad recipe, terminal shard failure, runtime error
EXIT_BROKEN_PIPE: Final = 141  # the reader of stdout left (`| head`): what a shell reports for a tool SIGPIPE ended


class ElasticError(Exception):
    """Base class of every error the plugin reports to users: ``where`` names the place (``file:line``, a
    path, ``shard part-00003-of-00016``, an operator), ``hint`` what to try (both optional but expected)."""

    exit_code: int = EXIT_ERROR

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None):
        self.message = message
        self.where = where
        self.hint = hint
        super().__init__(message, where, hint)

    def __reduce__(self):  # keep fields across pickling (Ray, multiprocessing)
        return functools.partial(type(self), where=self.where, hint=self.hint), (self.message,)

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            text += f" ({self.hint})"
        return text


class ConfigError(ElasticError):
    """The `elastic:` block or a CLI option has a bad value."""


class RecipeError(ElasticError):
    """The recipe cannot be run shard by shard (unsafe operator, stats_export_path...)."""


class InputError(ElasticError):
    """An input file or row is malformed (names file:line)."""


class InputChangedError(ElasticError):
    """An input file changed between prepare passes or since prepare."""


class JobDirError(ElasticError):
    """The job directory is missing, foreign, corrupt, or holds a different job."""


class UnsafePathError(JobDirError):
    """A job-directory path leads outside it (a planted symlink): nothing is written there."""


class ShardExecutionError(ElasticError):
    """Data-Juicer raised while processing a shard (operator error, Ray task failure)."""


class RayConnectionError(ElasticError):
    """The node-local Ray runtime could not be started or reached."""


class IntegrityError(ElasticError):
    """A published shard result does not match its record (rows, bytes, sha256)."""


class StageIdentityMismatch(ElasticError):
    """This worker's Data-Juicer/operator code gives different stage identities."""


class CodeMismatchError(StageIdentityMismatch):
    """This worker's operator code (or Data-Juicer/plugin/Ray versions) differs from the job's record."""


class ShardFailedError(ElasticError):
    """At least one shard reached its retry budget and is terminally failed."""


class OutputExistsError(ElasticError):
    """The export path holds a different file and overwrite was not requested."""


class MergeBusyError(JobDirError):
    """Another follower holds the partial output (``shards.merge.follow_merge``)."""


class IntegrationError(ElasticError):
    """A Data-Juicer internal the plugin hooks into moved or changed."""


class CoordinatorLostError(ElasticError):
    """The instance elected to prepare or finalize a run stopped before publishing its result."""


class ParticipationError(ElasticError):
    """Strict mode: the required nodes did not all take part, or work is left that nobody may claim."""


class LeaseLostError(ElasticError):
    """This worker lost its claim (heartbeat could not be renewed, or a newer generation exists)."""


class BatchContractError(ElasticError):
    """An opted-in operator broke the micro-batch contract (row count, row order or columns per slice)."""


class MicroBatchOOMError(ElasticError):
    """Out of memory at the smallest micro-batch after the bounded waits: nothing smaller exists.
    Raised even with ``skip_op_error``: dropping the rows would lose data silently."""


def preview(names: list[str], limit: int = 5) -> str:
    """The first ``limit`` names, and how many more: an error names a few, never thousands."""
    return ", ".join(names[:limit]) + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, ending in "..." when it was cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def last_line(text: str | None) -> str:
    """The last non-blank line of an error text or a tool's output: the line that names the error."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def is_worker_fault(exc: BaseException) -> bool:
    """True when an attempt failed because of *this worker*, not of the shard (an unsafe job directory
    is not the shard's fault either): the worker hands the claim back at once and stops, without
    spending the shard's retry budget, so a correctly set-up worker can take it."""
    if isinstance(exc, OSError) and exc.errno in PERMANENT_STORAGE_ERRNOS:
        return True  # no permission / read-only mount here: retrying the shard cannot help
    return isinstance(exc, (StageIdentityMismatch, IntegrationError, RayConnectionError, UnsafePathError))


# A permission or mount problem of this node, not of the shard.
PERMANENT_STORAGE_ERRNOS: Final = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
# A filesystem that takes no more writes (full, over quota, read-only).
WRITE_REFUSED_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


# Where a failed path lies, for the hint: (role, root) pairs, the most specific first, e.g.
# (("job directory", job_dir), ("export location", dirname(export_path))).
Places = Sequence[tuple[str, object]]


def storage_error(exc: OSError, where: object, then: str = "run the worker again", places: Places = ()) -> JobDirError:
    """An OSError from the job directory (or an input or output file) as one clear error naming
    the path (exit 2) and, when it lies in one of ``places``, that place's role and root;
    ``then`` is the step to take once the cause is fixed."""
    path = exc.filename or where
    if exc.filename2 and exc.errno in WRITE_REFUSED_ERRNOS:
        path = exc.filename2  # a copy, link or rename: the target is what could not be written

    if exc.errno in PERMANENT_STORAGE_ERRNOS:
        advice = f"check that this user may read and write there and that it is not mounted read-only, then {then}"
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        advice = f"free space or raise the quota there, then {then}"
    else:
        advice = f"check free space, quota and the health of the filesystem there, then {then}"
    place = place_of(path, places)
    return JobDirError(
        f"storage error: {exc.strerror or exc}", where=str(path), hint=f"{place}: {advice}" if place else advice
    )


def place_of(path: object, places: Places) -> str | None:
    """``"the <role> <root>"`` of the first place holding ``path`` (or below it: a folder of
    the place that could not be created), else None."""
    text = os.path.abspath(os.fspath(path)) if path else ""
    for role, root in places:
        if not text or root is None:
            continue
        base = os.path.abspath(os.fspath(root))
        if os.path.commonpath([text, base]) in (text, base):  # the same, or one below the other
            return f"the {role} {base}"
    return None


class storage_errors:  # noqa: N801 - used like a function, as a decorator or a context manager
    """Turn an OSError escaping the block (or the decorated function) into :func:`storage_error`.
    As a decorator, ``places`` may be a function of the call's arguments."""

    def __init__(self, then: str, places: Places | Callable[..., Places] = ()):
        self.then, self.places = then, places

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, traceback: object) -> bool:
        if isinstance(exc, OSError):
            raise storage_error(exc, "", self.then, () if callable(self.places) else self.places) from exc
        return False

    def __call__(self, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except OSError as exc:
                places = self.places(*args, **kwargs) if callable(self.places) else self.places
                raise storage_error(exc, "", self.then, places) from exc

        return guarded


# -- Signals: BaseExceptions that carry a decision through code that catches Exception. --------------
# Never shown to a user as an error.


class WorkerInterrupted(BaseException):
    """Raised in the worker's main thread by its SIGTERM/SIGINT handler (``jobdir.worker``);
    a BaseException, so that a runner's ``except Exception`` does not swallow it."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


class DispatchToElastic(BaseException):  # noqa: N818 - control flow, not an error
    """Carries an elastic cfg out of Data-Juicer's ``main`` (integration.dispatch); a BaseException:
    loguru's ``@logger.catch`` around Data-Juicer's ``main`` must not log it."""

    def __init__(self, executor_type: str, cfg: object):
        super().__init__(executor_type)
        self.cfg = cfg


class DispatchAbort(BaseException):  # noqa: N818 - control flow, not an error
    """Carries an ElasticError out of Data-Juicer's ``main`` without loguru's traceback."""

    def __init__(self, error: ElasticError):
        super().__init__(str(error))
        self.error = error


# -- Internal: raised and caught within one step; the user sees the ElasticError that follows. --------


class RowError(ValueError):
    """One input row breaks the row policy (``rows.row_policy``); words the reason, without the
    file:line (the reader adds it when it turns this into an InputError)."""


class RequestChanged(Exception):
    """The whole prepare request's input fields differ from the early one the input pass started
    with (``shards.prepare``); nothing was published."""


class ScanRefused(Exception):  # noqa: N818 - a verdict, not a failure
    """A scan found its shard's input unusable (``shards.scan``); ``refusal`` is the
    ``jobdir.records.ScanRefusal`` it publishes as its result."""

    def __init__(self, refusal: object):
        super().__init__(refusal)
        self.refusal = refusal


class PrepareCancelled(Exception):
    """The recipe was refused while the overlapped input pass ran (``preparation``): stop the pass.
    Not an ElasticError: it never reaches the user, the refusal itself is raised instead."""


# -- The demo operator's stand-in for torch.OutOfMemoryError. -------------------------------------------


class SimulatedOutOfMemoryError(RuntimeError):
    """Raised by the demo operator (batching.demo) instead of torch.OutOfMemoryError when torch
    is not installed (classified by its message)."""
