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
