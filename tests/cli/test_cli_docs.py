"""`semgov docs`: every documentation file is a topic, printed as it is on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from semgov.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_the_list_names_every_doc_with_its_title(capsys: pytest.CaptureFixture[str]) -> None:
    """Every docs/*.md, README.md and audit/README.md is listed, with its first heading."""
    assert main(["docs"]) == 0
    listed = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert set(listed) == {"readme", "audit", *(f.stem for f in (ROOT / "docs").glob("*.md"))}
    assert listed["gateway"].startswith("The gateway")


def test_a_topic_prints_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    """`semgov docs policy` prints docs/policy.md exactly; `.md` and case are accepted."""
    assert main(["docs", "Policy.md"]) == 0
    assert capsys.readouterr().out == (ROOT / "docs" / "policy.md").read_text(encoding="utf-8")


def test_an_unknown_topic_names_the_topics(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown topic exits 2 and lists what there is."""
    assert main(["docs", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no topic 'nope'" in err and "gateway" in err


def test_the_wheel_ships_the_docs_where_semgov_docs_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A built wheel carries README.md, docs/*.md and audit/README.md as share/semgov/docs data, and
    `semgov docs` outside a checkout lists and prints them from there."""
    import subprocess
    import sys
    import zipfile

    import semgov.cli.docs as docs

    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT),
         "-w", str(tmp_path)],
        check=True, capture_output=True, timeout=600, cwd=str(tmp_path),
    )  # fmt: skip
    (wheel,) = tmp_path.glob("semgov-*.whl")
    prefix = "semgov-0.1.0.data/data/"
    with zipfile.ZipFile(wheel) as z:
        data = [n for n in z.namelist() if n.startswith(prefix + "share/semgov/docs/")]
        z.extractall(tmp_path / "x", data)
    shipped = {n[len(prefix + "share/semgov/docs/") :] for n in data}
    assert shipped == {"README.md", "audit/README.md", *(f"{f.name}" for f in (ROOT / "docs").glob("*.md"))}
    monkeypatch.setattr(docs, "_SOURCE", tmp_path / "no-checkout")
    monkeypatch.setattr(docs, "_INSTALLED", tmp_path / "x" / prefix / "share" / "semgov" / "docs")
    assert main(["docs", "gateway"]) == 0
    assert capsys.readouterr().out == (ROOT / "docs" / "gateway.md").read_text(encoding="utf-8")
    assert set(docs.topics()) == {"readme", "audit", *(f.stem for f in (ROOT / "docs").glob("*.md"))}
