"""Reading a bundle's tar.gz is bounded: traversal, links, huge, duplicate or too many members are refused."""

from __future__ import annotations

import tarfile

import pytest

from semgov.bundle import archive
from semgov.bundle.archive import read_tarball, write_tarball
from semgov.bundle.bundle import verify_bundle
from semgov.errors import BundleError
from tests.bundle.conftest import Keys, raw_tarball


def refused(data: bytes) -> str:
    with pytest.raises(BundleError) as e:
        read_tarball(data, source="b.tar.gz")
    return e.value.diagnostic()


def _link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize(
    "name", ["../etc/passwd", "/../x", "a/../../x", "//etc/passwd", "a//b", "a\\b", "a/./b"]
)
def test_path_traversal_and_ambiguous_names_are_refused(name: str) -> None:
    """A name climbing out of the bundle or spelled ambiguously is refused, quoting it."""
    assert "unsafe member name" in refused(raw_tarball([(name, b"x")]))


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE], ids=["symlink", "hardlink"])
def test_links_are_refused(kind: bytes) -> None:
    """Symbolic and hard links are refused, naming the member."""
    assert refused(raw_tarball([_link("/policy/policy.yaml", "/etc/passwd", kind)])) == (
        "b.tar.gz: policy/policy.yaml: a link: bundles hold regular files only"
    )


def test_a_duplicate_member_is_refused() -> None:
    """The same name twice (with and without OPA's leading slash) is refused."""
    assert refused(raw_tarball([("/keyring.json", b"{}"), ("keyring.json", b"[]")])) == (
        "b.tar.gz: keyring.json: appears twice in the bundle"
    )


def test_a_huge_member_and_too_many_members_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the member size, total size or member count the archive is refused before it is read whole."""
    monkeypatch.setattr(archive, "MAX_MEMBER_BYTES", 10)
    assert (
        refused(raw_tarball([("/big", b"x" * 11)]))
        == "b.tar.gz: big: 11 bytes, over the 10 bytes a member may have"
    )
    monkeypatch.setattr(archive, "MAX_MEMBERS", 3)
    assert refused(raw_tarball([(f"/f{i}", b"") for i in range(4)])) == "b.tar.gz: more than 3 members"


def test_garbage_and_a_truncated_archive_are_refused() -> None:
    """Bytes that are not a tar.gz, or a tar.gz cut short, are refused as unreadable."""
    assert "not a readable tar.gz bundle" in refused(b"not a bundle")
    whole = write_tarball({"keyring.json": b"{}" * 1000})
    assert "not a readable tar.gz bundle" in refused(whole[: len(whole) // 2])


def test_a_member_named_like_the_signatures_is_refused(keys: Keys) -> None:
    """OPA reads any member ending in signatures.json as the signatures: such a member is refused."""
    with pytest.raises(BundleError, match="policy/signatures.json: OPA reads any"):
        verify_bundle(raw_tarball([("/policy/signatures.json", b"{}")]), keys.trust, source="b.tar.gz")


def test_written_bundles_are_reproducible_and_read_back() -> None:
    """write_tarball is byte-for-byte reproducible, and read_tarball gives the files back."""
    files = {".manifest": b"{}", "policy/policy.yaml": b"a"}
    assert write_tarball(files) == write_tarball(files)
    assert read_tarball(write_tarball(files), source="b") == files
