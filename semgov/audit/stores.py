"""Where a shipped audit log goes: an S3-compatible bucket, or a directory (a mounted store).

Both write every object once and never replace it:

- :class:`S3Store` (``s3://BUCKET/PREFIX``): ``PutObject`` with ``If-None-Match: *``, the
  conditional write AWS S3 and S3-compatible stores (MinIO, Ceph RGW, ...) offer: a second write
  of a key is refused (412) and the store keeps the first. With S3 Object Lock on the bucket
  (compliance mode), not even the bucket's owner can delete a version before its retention ends.
  boto3 (the ``ship`` extra) reads credentials, region and endpoint the usual way
  (``AWS_ACCESS_KEY_ID``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``, profiles, instance roles).
- :class:`DirStore` (a path): a directory, for a store mounted as a file system (NFS, gcsfuse,
  s3fs) or a local staging disk that a log pipeline picks up: each object is written to a temp
  file, fsynced, and hard-linked to its name (refused if it exists), then the directory fsynced.

A store that cannot be reached (no route, a timeout, a 5xx) raises :class:`StoreUnavailable`:
the shipper keeps the local log as it is and tries again later. Every other failure raises
:class:`~semgov.audit.ship.ShipError` naming the store and the key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from semgov.audit.fsio import open_dir, write_once
from semgov.audit.ship import ShipError

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Connect and read timeouts of one S3 call, in seconds; botocore retries a call 3 times in all.
S3_CONNECT_TIMEOUT_S = 5.0
S3_READ_TIMEOUT_S = 30.0


class StoreUnavailable(ShipError):
    """The store cannot be reached now: nothing was lost, try again later."""


class Store(Protocol):
    """An object store that writes each key once."""

    #: Where it is, for messages (``s3://bucket/`` or a directory path with a trailing ``/``).
    where: str

    def list(self, prefix: str) -> list[str]:
        """Every key under ``prefix``, as the part after it, in lexicographic order."""
        ...

    def put_once(self, key: str, data: bytes) -> bytes | None:
        """Write ``data`` at ``key`` unless the key exists; None if written, else the bytes it holds."""
        ...

    def get(self, key: str) -> bytes:
        """The bytes at ``key``."""
        ...


class DirStore:
    """Objects as files under a directory; a key's ``/`` are subdirectories."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.where = f"{root}/"

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise ShipError(f"{key!r} is not a key this store writes", source=self.where)
        return self.root.joinpath(*parts)

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        try:
            found = [
                str(p.relative_to(base))
                for p in base.rglob("*")
                if p.is_file() and not p.name.startswith(".")
            ]
        except OSError as e:
            raise StoreUnavailable(f"cannot list {base}: {e.strerror or e}", source=self.where) from e
        return sorted(found)

    def put_once(self, key: str, data: bytes) -> bytes | None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = open_dir(path.parent)
            try:
                return write_once(fd, path.parent, path.name, data)
            finally:
                os.close(fd)
        except OSError as e:
            raise StoreUnavailable(f"cannot write {key}: {e.strerror or e}", source=self.where) from e

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except OSError as e:
            raise ShipError(f"cannot read {key}: {e.strerror or e}", source=self.where) from e


class S3Store:
    """Objects in one S3 bucket (any S3-compatible endpoint)."""

    def __init__(self, bucket: str, client: Any) -> None:
        self.bucket = bucket
        self.client = client
        self.where = f"s3://{bucket}/"

    def _call(self, what: str, key: str, fn: Any, **kw: Any) -> Any:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        try:
            return fn(Bucket=self.bucket, **kw)
        except ClientError as e:
            err = e.response.get("Error", {})
            status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if status >= 500 or err.get("Code") in ("SlowDown", "RequestTimeout"):
                raise StoreUnavailable(
                    f"{what} {key}: {err.get('Code')} ({status})", source=self.where
                ) from e
            raise ShipError(
                f"{what} {key}: {err.get('Code')}: {err.get('Message')}", source=self.where
            ) from e
        except (NoCredentialsError, PartialCredentialsError) as e:
            raise ShipError(
                f"{what} {key}: {e} (AWS_ACCESS_KEY_ID, a profile or a role)", source=self.where
            ) from e
        except BotoCoreError as e:  # no route, refused, timed out, ...
            raise StoreUnavailable(f"{what} {key}: {e}", source=self.where) from e

    def _pages(self, prefix: str) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Prefix": prefix}
            if token:
                kw["ContinuationToken"] = token
            page = self._call("list", prefix, self.client.list_objects_v2, **kw)
            yield page
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def list(self, prefix: str) -> list[str]:
        keys = [o["Key"] for page in self._pages(prefix) for o in page.get("Contents", [])]
        return sorted(k[len(prefix) :] for k in keys if k.startswith(prefix))

    def put_once(self, key: str, data: bytes) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            self._call("write", key, self.client.put_object, Key=key, Body=data, IfNoneMatch="*")
        except ShipError as e:
            cause = e.__cause__
            if isinstance(cause, ClientError) and cause.response.get("Error", {}).get("Code") in (
                "PreconditionFailed",
                "ConditionalRequestConflict",
            ):
                return self.get(key)
            raise
        return None

    def get(self, key: str) -> bytes:
        body = self._call("read", key, self.client.get_object, Key=key)["Body"]
        try:
            return bytes(body.read())
        finally:
            body.close()


def open_store(url: str, *, endpoint_url: str | None = None) -> tuple[Store, str]:
    """The store ``url`` names and the key prefix inside it: ``s3://BUCKET[/PREFIX]`` or a directory."""
    if not url.startswith("s3://"):
        if "://" in url:
            raise ShipError(f"{url}: a store is s3://BUCKET[/PREFIX] or a directory path", source=url)
        return DirStore(Path(url)), ""
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket:
        raise ShipError("s3://: no bucket named", source=url)
    try:
        import boto3
        from botocore.config import Config
    except ImportError as e:
        raise ShipError(
            "shipping to S3 needs boto3: pip install 'semgov[ship]' (or pip install boto3)", source=url
        ) from e
    config = Config(
        connect_timeout=S3_CONNECT_TIMEOUT_S,
        read_timeout=S3_READ_TIMEOUT_S,
        retries={"max_attempts": 3, "mode": "standard"},
    )
    client = boto3.client("s3", endpoint_url=endpoint_url, config=config)
    return S3Store(bucket, client), prefix
