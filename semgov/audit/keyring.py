"""The audit keyring: which keys vouch for an audit log, for which part of it, and which are revoked.

A log outlives its keys: the decision-signing key and the checkpoint key (in ``semgov check``
and the SGLang hook one key, the writer's) are rotated, and a key found compromised is revoked.
Each entry of the keyring names a key by the id records and checkpoints carry (records:
``key_id``; checkpoints and seals: the C2SP key name, :func:`key_name_for` of that id) and says
where in the log it may sign:

- ``not_before_size`` (default 0) and ``not_after_size`` (default none: open-ended): the key may
  sign the records with index ``not_before_size <= i < not_after_size`` and seals and checkpoints
  of tree size ``not_before_size <= size <= not_after_size``. Sizes, not times: positions in the
  log are what a verifier can check, a timestamp is only what the signer claims.
- ``signs`` (default both): ``"records"`` and/or ``"checkpoints"`` (seals are checkpoints), so
  that a stolen decision key cannot vouch for a checkpoint when the two keys differ.
- ``revoked``: nothing signed by the key is trusted, anywhere. Revocation follows the key
  material: a public key revoked under one id is revoked under every id naming it.

The file format extends the provenance keyring's (docs/formats.md "Keyring"): a provenance
keyring file is an audit keyring in which every key may sign everything, everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from semgov.errors import InputError, KeyFileError
from semgov.signing.keys import key_id_for, parse_public_pem
from semgov.wire.strictjson import StrictJSONError
from semgov.wire.strictjson import loads as strict_loads

ROLES = frozenset({"records", "checkpoints"})
_KEY_NAME_BAD = re.compile(r"[\s+\x00-\x1f\x7f]")
_JSON_LINE = re.compile(r"\(line (\d+), column \d+\)")


def key_name_for(key_id: str) -> str:
    """A C2SP note key name for ``key_id``: spaces, control characters and ``+`` become ``_``.

    (c2sp.org/signed-note: a key name is non-empty UTF-8 without Unicode spaces or ``+``; ``:``
    is allowed, so ``ed25519:0123abcd...`` is used as is.)
    """
    name = _KEY_NAME_BAD.sub("_", key_id)
    return name or "semgov"


def _raw(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes_raw()


@dataclass(frozen=True)
class AuditKey:
    """One key of an :class:`AuditKeyring` and the part of the log it may sign."""

    key_id: str
    public_key: Ed25519PublicKey
    revoked: bool = False
    not_before_size: int = 0
    not_after_size: int | None = None
    signs: frozenset[str] = ROLES

    @property
    def key_name(self) -> str:
        """The C2SP key name its checkpoint and seal signatures carry."""
        return key_name_for(self.key_id)

    def covers_record(self, index: int) -> bool:
        """May this key sign record ``index`` (ignoring revocation and roles)?"""
        return self.not_before_size <= index and (self.not_after_size is None or index < self.not_after_size)

    def covers_size(self, size: int) -> bool:
        """May this key sign a seal or checkpoint of tree size ``size`` (ignoring revocation and roles)?"""
        return self.not_before_size <= size and (self.not_after_size is None or size <= self.not_after_size)

    def trusted_for_size(self, size: int) -> bool:
        """Not revoked, allowed to sign checkpoints, and valid at tree size ``size``."""
        return not self.revoked and "checkpoints" in self.signs and self.covers_size(size)

    def validity(self) -> str:
        """Where the key may sign, in words (for messages)."""
        lo, hi = self.not_before_size, self.not_after_size
        if hi is None:
            return f"records {lo}.., checkpoints of size {lo}.."
        records = f"records {lo}..{hi - 1}" if hi > lo else "no records"
        return f"{records}, checkpoints of size {lo}..{hi}"


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    key_id: str = Field(min_length=1)
    public_key: str
    revoked: bool = False
    not_before_size: int = Field(default=0, ge=0, lt=2**64)
    not_after_size: int | None = Field(default=None, ge=0, lt=2**64)
    signs: list[Literal["records", "checkpoints"]] = Field(default=["records", "checkpoints"], min_length=1)


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    keys: list[_Entry]


class AuditKeyring:
    """Keys that may vouch for an audit log, by id (records) and by C2SP key name (seals, checkpoints)."""

    def __init__(self, keys: Iterable[AuditKey]) -> None:
        keys = list(keys)
        revoked = {_raw(k.public_key) for k in keys if k.revoked}
        self._by_id: dict[str, AuditKey] = {}
        for k in keys:
            if k.key_id in self._by_id:
                raise ValueError(f"duplicate key_id {k.key_id!r}")
            if not k.revoked and _raw(k.public_key) in revoked:
                k = AuditKey(k.key_id, k.public_key, True, k.not_before_size, k.not_after_size, k.signs)
            self._by_id[k.key_id] = k
        self._by_name = {k.key_name: k for k in self._by_id.values()}

    @classmethod
    def single(cls, public_key: Ed25519PublicKey) -> AuditKeyring:
        """A keyring of one key, valid for everything (``semgov audit verify --pubkey``)."""
        return cls([AuditKey(key_id_for(public_key), public_key)])

    def get(self, key_id: str) -> AuditKey | None:
        return self._by_id.get(key_id)

    def by_name(self, key_name: str) -> AuditKey | None:
        """The key whose C2SP key name is ``key_name`` (as a checkpoint or seal signature line names it)."""
        return self._by_name.get(key_name)

    def __iter__(self) -> Iterator[AuditKey]:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def with_key(self, key: AuditKey) -> AuditKeyring:
        """This keyring plus ``key`` (replacing an entry of the same id)."""
        return AuditKeyring([*(k for k in self if k.key_id != key.key_id), key])

    @classmethod
    def load(cls, path: Path) -> AuditKeyring:
        """Load a keyring file (see the module docstring); :class:`InputError` names the file and field."""
        src = str(path)
        try:
            raw = Path(path).read_bytes()
        except OSError as e:
            raise KeyFileError(f"cannot read keyring: {e.strerror}", source=src) from e
        try:
            doc = strict_loads(raw)
        except StrictJSONError as e:
            why = str(e).removeprefix("not JSON: ")
            m = _JSON_LINE.search(why)
            raise InputError(
                f"keyring is not valid JSON: {why}", source=src, line=int(m.group(1)) if m else None
            ) from e
        try:
            parsed = _File.model_validate(doc)
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            loc = ".".join(str(p) for p in err["loc"])
            raise InputError(f"invalid keyring: {err['msg']}", source=src, field=loc) from e
        keys: list[AuditKey] = []
        seen: set[str] = set()
        for i, entry in enumerate(parsed.keys):
            if entry.key_id in seen:
                raise InputError(f"duplicate key_id {entry.key_id!r}", source=src, field=f"keys.{i}")
            seen.add(entry.key_id)
            na, nb = entry.not_after_size, entry.not_before_size
            if na is not None and na < nb:
                raise InputError(
                    f"invalid keyring: not_after_size {na} is below not_before_size {nb}",
                    source=src,
                    field=f"keys.{i}",
                )
            pk = parse_public_pem(entry.public_key.encode("utf-8"), source=src, field=f"keys.{i}.public_key")
            keys.append(AuditKey(entry.key_id, pk, entry.revoked, nb, na, frozenset(entry.signs)))
        return cls(keys)
