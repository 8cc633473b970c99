"""`semgov audit verify` never says OK when it checked no signature (issue 12, item 6)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from semgov.audit.frames import FRAME_HEADER, LOG_FILE
from semgov.audit.verify_dir import verify_log
from semgov.cli.main import main
from tests.audit_fixtures import KEY, SEAL_FLAG, decisions, split_frames, write_log


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory, keys: Any) -> Path:
    d = tmp_path_factory.mktemp("unverified") / "log"
    write_log(d, decisions(keys, KEY, 4))
    return d


def test_verify_without_a_key_says_unverified_and_fails(
    pristine: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --pubkey or --keyring: UNVERIFIED, exit 3, never OK, saying how many signatures were not checked."""
    assert main(["audit", "verify", str(pristine), "--workers", "1"]) == 3
    out = capsys.readouterr().out
    assert "OK" not in out
    assert "UNVERIFIED: no --pubkey or --keyring given" in out
    assert "4 record signatures" in out and "--structure-only" in out


def test_structure_only_must_be_asked_for_and_says_what_it_skipped(
    pristine: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--structure-only checks frames, hashes and the tree, exit 0, and says no signature was checked."""
    assert main(["audit", "verify", str(pristine), "--workers", "1", "--structure-only"]) == 0
    out = capsys.readouterr().out
    assert "OK (structure only): no signature was checked" in out
    assert "signatures checked: 0" in out
    rep = verify_log(pristine, workers=1)
    assert rep.ok and rep.structure_only and rep.signatures_checked == 0


def test_structure_only_still_fails_on_tampering(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flipped record byte fails a structure-only check too (exit 1, FAILED with the index)."""
    d = tmp_path / "log"
    d.mkdir()
    data = bytearray((pristine / LOG_FILE).read_bytes())
    frames = split_frames(bytes(data))
    offsets = [sum(len(f) for _, f in frames[:k]) for k in range(len(frames))]
    second = [off for off, (i, _) in zip(offsets, frames, strict=True) if not i & SEAL_FLAG][1]
    data[second + FRAME_HEADER.size + 5] ^= 0x01
    for p in pristine.rglob("*"):
        if p.is_file() and p.name != "LOCK":
            target = d / p.relative_to(pristine)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(p.read_bytes())
    (d / LOG_FILE).write_bytes(bytes(data))
    assert main(["audit", "verify", str(d), "--workers", "1", "--structure-only"]) == 1
    assert "FAILED: record 1:" in capsys.readouterr().out


def test_structure_only_and_a_key_are_exclusive(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--structure-only with --pubkey is a usage error (exit 2), not a silent downgrade."""
    from tests.audit_fixtures import PUB_PEM

    with pytest.raises(SystemExit) as exc:
        main(["audit", "verify", str(pristine), "--pubkey", PUB_PEM, "--structure-only"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
