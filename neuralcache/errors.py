"""Domain errors.  Backends raise these; the FUSE edge (fs/operations.py) maps them to errno
with its one table; the CLI prints ``UserError`` as one line without a traceback."""
from __future__ import annotations


class NeuralCacheError(Exception):
    """Base of every error NeuralCache raises on purpose."""


class UserError(NeuralCacheError):
    """Bad input or environment: printed as one line that says what to do, exit 1."""


class BackendError(NeuralCacheError):
    """A backend request failed for good (after retries)."""


class NotFound(BackendError):
    """The object or bucket does not exist."""


class PermissionDenied(BackendError):
    """Credentials were refused or lack a permission."""


class Unavailable(BackendError):
    """The remote did not answer in time or answered with a transient error."""


class VersionChanged(BackendError):
    """The object changed since its version was pinned (If-Match failed)."""


class JournalError(NeuralCacheError):
    """The write journal (staging files, intent log) could not be written."""


class JournalFull(JournalError):
    """No space left for the write journal: the writer gets ENOSPC."""


class PathError(NeuralCacheError):
    """A change to the namespace of a writable mount that POSIX forbids."""


class AlreadyExists(PathError):
    """The target name exists (mkdir, rename with RENAME_NOREPLACE)."""


class IsADirectory(PathError):
    """A file operation on a directory."""


class NotADirectory(PathError):
    """A directory operation on a file."""


class DirectoryNotEmpty(PathError):
    """rmdir of (or rename over) a directory that has entries."""


class InvalidChange(PathError):
    """A change that cannot be made (a directory into itself, RENAME_EXCHANGE)."""


class NotSupported(PathError):
    """Links, device nodes and extended attributes are not kept."""


class NameTooLong(PathError):
    """A name component over 255 bytes, or a key longer than the remote accepts."""


class FileTooBig(PathError):
    """A length past the largest object the remote accepts (S3: 5 TiB)."""


def first_error(group: BaseExceptionGroup) -> BaseException:
    """A trio nursery's group of errors as its first error, itself, when every error in
    it is an ordinary Exception: the FUSE edge's errno table, the readers' ``except
    NotFound`` and the CLI's ``except UserError`` match by type, and the group (trio's
    strict groups: one task of a multi-block read failing with VersionChanged, a
    UserError raised inside the daemon's nursery) would match none of them (EIO, an
    "internal error").  The group itself if it holds a Cancelled or KeyboardInterrupt:
    trio's to unwind."""
    leaves = list(_leaves(group))
    if leaves and all(isinstance(e, Exception) for e in leaves):
        return leaves[0]
    return group


def _leaves(group: BaseExceptionGroup):
    """The errors of a group and of the groups in it, depth first, in order."""
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            yield from _leaves(e)
        else:
            yield e
