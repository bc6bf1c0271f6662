"""S3 writes (a ``--writable`` mount): PUT, multipart upload, server-side copy, delete.

A mixin of ``S3Backend`` (backends/s3.py), kept apart from the read path.  Every call
goes through botocore with ``S3Backend._call``: our retry policy (backends/retry.py)
and the one error table, so callers see only NotFound, PermissionDenied and
Unavailable.  Every call is safe to repeat: a PUT, a part or a copy sent twice leaves
the same object; deleting a missing key succeeds.

Part sizes and how many parts are in flight are the uploader's business
(neuralcache/write/uploader.py); this module only speaks the protocol.
"""
from __future__ import annotations

import logging
import time

from ..errors import Unavailable
from .base import ObjectInfo

log = logging.getLogger(__name__)

# Largest object CopyObject accepts (AWS: 5 GB); larger ones are copied part by part
# with UploadPartCopy.
COPY_MAX = 5 << 30
# UploadPartCopy range per part above COPY_MAX: 1 GiB keeps a 100 GiB checkpoint at 100
# parts (AWS allows 10,000 parts of at most 5 GB each).
COPY_PART = 1 << 30
# Empty directory entries _drop_empty_dir_entry removes at most (SeaweedFS keeps them;
# see there): a job's own tree of empty directories is far smaller, and past this the
# completion fails as before and the file stays in the journal.
MAX_EMPTY_DIRS = 1000


def _etag(resp: dict) -> str:
    return str(resp.get("ETag", "")).strip('"')


class S3Writes:
    """Needs ``bucket``, ``prefix``, ``_client`` and ``_call`` (S3Backend)."""

    def put(self, key: str, data: bytes) -> ObjectInfo:
        """One PUT of the whole object (small files)."""
        full = self.prefix + key
        r = self._call(f"put {key}", lambda: self._client.put_object(
            Bucket=self.bucket, Key=full, Body=data))
        return ObjectInfo(key, len(data), _etag(r), time.time())

    def create_multipart(self, key: str) -> str:
        full = self.prefix + key
        r = self._call(f"start upload of {key}", lambda: self._client.create_multipart_upload(
            Bucket=self.bucket, Key=full))
        return r["UploadId"]

    def upload_part(self, key: str, upload_id: str, number: int, offset: int,
                    data: bytes) -> str:
        """Part ``number`` (1-based) of an upload; ``offset`` is for backends that write
        in place (POSIX) and unused here.  Returns the part's ETag."""
        full = self.prefix + key
        r = self._call(f"upload part {number} of {key}", lambda: self._client.upload_part(
            Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=data))
        return _etag(r)

    def complete_multipart(self, key: str, upload_id: str, parts: list[tuple[int, str]],
                           size: int) -> ObjectInfo:
        full = self.prefix + key
        doc = {"Parts": [{"PartNumber": n, "ETag": f'"{e}"'} for n, e in sorted(parts)]}

        def complete():
            return self._call(f"complete upload of {key}",
                              lambda: self._client.complete_multipart_upload(
                                  Bucket=self.bucket, Key=full, UploadId=upload_id,
                                  MultipartUpload=doc))
        try:
            r = complete()
        except Unavailable as exc:
            if "InternalError" not in str(exc) or not self._drop_empty_dir_entry(key):
                raise
            try:
                r = complete()
            except Unavailable as exc2:
                if "InternalError" not in str(exc2):
                    raise
                # SeaweedFS again: ``key`` itself is a directory entry that also holds
                # an object (a PUT of ``key`` while ``key/`` had objects, all deleted
                # since).  Deleting ``key`` removes that entry; this upload replaces
                # its object anyway.  The third refusal in a row reaches the caller,
                # which keeps the file in the journal.
                self._call(f"delete {key}", lambda: self._client.delete_object(
                    Bucket=self.bucket, Key=full))
                log.info("%s: replaced the store's directory entry of that name that "
                         "refused the upload's completion", key)
                r = complete()
        return ObjectInfo(key, size, _etag(r), time.time())

    def _drop_empty_dir_entry(self, key: str) -> bool:
        """SeaweedFS keeps a directory's entry after the last object under it is
        deleted, and then refuses to complete a multipart upload of a file of that name
        (InternalError, "existing entry is a directory"; a single PUT replaces the
        entry).  If no object is stored under ``key/``, delete that entry and the empty
        directory entries nested in it (deepest first: SeaweedFS deletes no directory
        with an entry in it), and say so.  On S3 this deletes nothing: an object named
        ``key/`` would have been listed."""
        full = self.prefix + key + "/"
        r = self._call(f"list {key}/", lambda: self._client.list_objects_v2(
            Bucket=self.bucket, Prefix=full, MaxKeys=1))
        if r.get("KeyCount", 0) or r.get("Contents"):
            return False
        entries, todo = [full], [full]
        while todo and len(entries) <= MAX_EMPTY_DIRS:
            prefix = todo.pop()
            r = self._call(f"list {prefix}", lambda: self._client.list_objects_v2(
                Bucket=self.bucket, Prefix=prefix, Delimiter="/"))
            if any(c["Key"] != prefix for c in r.get("Contents", [])):
                return False    # an object appeared: leave all of it alone (SeaweedFS
                                # may list the directory itself as "prefix")
            subs = [c["Prefix"] for c in r.get("CommonPrefixes", [])]
            entries += subs
            todo += subs
        for entry in sorted(entries, key=lambda e: -e.count("/")):
            self._call(f"delete {entry}", lambda entry=entry: self._client.delete_object(
                Bucket=self.bucket, Key=entry))
        log.info("%s: removed the store's %d empty directory entries under %s/ that "
                 "refused the upload's completion", key, len(entries), key)
        return True

    def abort_multipart(self, key: str, upload_id: str) -> None:
        full = self.prefix + key
        try:
            self._call(f"abort upload of {key}", lambda: self._client.abort_multipart_upload(
                Bucket=self.bucket, Key=full, UploadId=upload_id), attempts=2)
        except Exception:  # best effort: a lifecycle rule or the next abort cleans up
            pass

    def copy(self, src: str, dst: str) -> ObjectInfo:
        """Server-side copy ``src`` -> ``dst`` (replacing ``dst``); NotFound if ``src``
        does not exist."""
        info = self.stat(src)
        if info.size > COPY_MAX:
            return self._copy_in_parts(src, dst, info.size)
        source = {"Bucket": self.bucket, "Key": self.prefix + src}
        r = self._call(f"copy {src} to {dst}", lambda: self._client.copy_object(
            Bucket=self.bucket, Key=self.prefix + dst, CopySource=source))
        return ObjectInfo(dst, info.size, _etag(r.get("CopyObjectResult", {})), time.time())

    def _copy_in_parts(self, src: str, dst: str, size: int) -> ObjectInfo:
        source = {"Bucket": self.bucket, "Key": self.prefix + src}
        upload_id = self.create_multipart(dst)
        parts = []
        try:
            for n, off in enumerate(range(0, size, COPY_PART), start=1):
                rng = f"bytes={off}-{min(size, off + COPY_PART) - 1}"
                r = self._call(f"copy part {n} of {src} to {dst}",
                               lambda n=n, rng=rng: self._client.upload_part_copy(
                                   Bucket=self.bucket, Key=self.prefix + dst,
                                   UploadId=upload_id, PartNumber=n, CopySource=source,
                                   CopySourceRange=rng))
                parts.append((n, _etag(r.get("CopyPartResult", {}))))
            return self.complete_multipart(dst, upload_id, parts, size)
        except BaseException:
            self.abort_multipart(dst, upload_id)
            raise

    def delete(self, key: str) -> None:
        full = self.prefix + key
        self._call(f"delete {key}", lambda: self._client.delete_object(
            Bucket=self.bucket, Key=full))
