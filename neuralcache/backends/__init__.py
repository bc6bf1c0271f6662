"""Backends: the remote namespace NeuralCache mounts (S3 or a POSIX directory)."""
from __future__ import annotations

from .base import Backend, ObjectInfo, valid_key
from ..errors import UserError


def open_backend(source: str, *, endpoint_url: str | None = None, region: str | None = None,
                 concurrency: int = 32, profile: str | None = None) -> Backend:
    """Backend for ``source``: ``s3://BUCKET[/PREFIX]`` or a directory path."""
    if source.startswith("s3://"):
        from .s3 import S3Backend

        rest = source[len("s3://"):]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise UserError(f"bad source {source!r}: expected s3://BUCKET[/PREFIX]")
        return S3Backend(bucket, prefix, endpoint_url=endpoint_url, region=region,
                         concurrency=concurrency, profile=profile)
    if "://" in source:
        raise UserError(f"bad source {source!r}: use s3://BUCKET[/PREFIX] or a directory path")
    from .posix import PosixBackend

    return PosixBackend(source)


__all__ = ["Backend", "ObjectInfo", "open_backend", "valid_key"]
