"""Reading captured requests: malformed lines are reported, salvaged and never stop the rest."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from semgov.errors import InputError
from semgov.intake.capture import MalformedLine, parse_line, read_captured
from semgov.wire.models import CapturedRequest
from tests.conftest import Keys, candidate, request


def _line(keys: Keys, **over: object) -> dict[str, object]:
    return request([candidate(keys)], **over)


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda r: r.update(schema="semgov.captured_request/v2"), "schema"),
        (lambda r: r.update(surprise=1), "surprise"),
        (lambda r: r.pop("tenant"), "tenant"),
        (lambda r: r.update(received_at="yesterday"), "received_at"),
        (lambda r: r.update(received_at="2026-11-29T10:00:00"), "received_at"),
        (lambda r: r["prompt"]["segments"].__setitem__(0, {"role": "system", "start": 0, "end": 19}), "tile"),
        (lambda r: r["prompt"]["segments"][0].update(role="preamble"), "role"),
        (lambda r: r["prompt"]["token_ids"].__setitem__(0, -1), "token_ids"),
        (lambda r: r["prompt"]["token_ids"].__setitem__(0, 2**32), "token_ids"),
        (lambda r: r["prompt"]["token_ids"].__setitem__(0, "7"), "token_ids"),
        (lambda r: r["candidates"][0].update(similarity="high"), "similarity"),
        (lambda r: r["candidates"][0].update(similarity=True), "similarity"),
        (lambda r: r.update(candidates=r["candidates"] * 2), "appears twice"),
        (lambda r: r.update(expect={"nobody": "allow"}), "not candidates"),
        (lambda r: r.update(expect={"r-03": "maybe"}), "expect"),
        (lambda r: r.update(tenant=""), "tenant"),
    ],
)
def test_malformed_requests_are_named(keys: Keys, mutate: object, needle: str) -> None:
    """Each kind of malformed request becomes a MalformedLine whose reason names the problem."""
    r = _line(keys)
    mutate(r)  # type: ignore[operator]
    got = parse_line(json.dumps(r).encode(), 7)
    assert isinstance(got, MalformedLine), got
    assert got.line == 7 and needle in got.reason


def test_nan_similarity_is_malformed(keys: Keys) -> None:
    """NaN and infinity (non-standard JSON) are refused."""
    raw = json.dumps(_line(keys)).replace('"similarity": 0.9', '"similarity": NaN')
    assert isinstance(parse_line(raw.encode(), 1), MalformedLine)


def test_salvage_keeps_request_and_donor_ids(keys: Keys) -> None:
    """A malformed request still yields its request id and donor ids so they can be denied."""
    r = _line(keys)
    r["tenant"] = 5
    got = parse_line(json.dumps(r).encode(), 3)
    assert isinstance(got, MalformedLine)
    assert got.request_id == "r-17" and got.donor_ids == ("r-03",) and got.tenant == ""


def test_read_mixed_file_continues_past_errors(tmp_path: Path, keys: Keys) -> None:
    """Good, blank, truncated and garbage lines: every line is accounted for in order."""
    good = json.dumps(_line(keys))
    p = tmp_path / "c.jsonl"
    p.write_text("\n".join([good, "", "{not json", good[: len(good) // 2], "[]", good]) + "\n")
    items = list(read_captured(p))
    kinds = [type(i).__name__ for i in items]
    assert kinds == ["CapturedRequest", "MalformedLine", "MalformedLine", "MalformedLine", "CapturedRequest"]
    assert [i.line for i in items if isinstance(i, MalformedLine)] == [3, 4, 5]


def test_gzip_and_truncated_gzip(tmp_path: Path, keys: Keys) -> None:
    """.gz files are read transparently; a truncated archive reports where reading stopped."""
    good = (json.dumps(_line(keys)) + "\n").encode()
    p = tmp_path / "c.jsonl.gz"
    p.write_bytes(gzip.compress(good * 3))
    assert all(isinstance(i, CapturedRequest) for i in read_captured(p))
    data = gzip.compress(good * 50)
    p.write_bytes(data[: len(data) // 2])
    items = list(read_captured(p))
    assert isinstance(items[-1], MalformedLine) and "cannot read further" in items[-1].reason


def _dir_line(keys: Keys, rid: str) -> str:
    return json.dumps(_line(keys, request_id=rid))


def test_directory_is_one_stream_in_name_order(tmp_path: Path, keys: Keys) -> None:
    """A directory's *.jsonl and *.jsonl.gz files are read in name order, other entries ignored."""
    (tmp_path / "b.jsonl").write_text(_dir_line(keys, "r-b1") + "\n\n" + _dir_line(keys, "r-b2") + "\n")
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress((_dir_line(keys, "r-a1") + "\n").encode()))
    (tmp_path / "c.jsonl").write_text(_dir_line(keys, "r-c1"))  # NOTE: no final newline
    (tmp_path / "notes.txt").write_text("{not json\n")
    (tmp_path / "d.json").write_text("{not json\n")
    (tmp_path / "sub.jsonl").mkdir()
    items = list(read_captured(tmp_path))
    assert [i.request_id for i in items if isinstance(i, CapturedRequest)] == ["r-a1", "r-b1", "r-b2", "r-c1"]
    assert not [i for i in items if isinstance(i, MalformedLine)]


def test_directory_malformed_lines_count_across_files(tmp_path: Path, keys: Keys) -> None:
    """Line numbers run on across the files; each reason names the file and its own line."""
    good = _dir_line(keys, "r-1")
    (tmp_path / "capture-1.jsonl").write_text(good + "\n\n{not json\n")
    (tmp_path / "capture-2.jsonl").write_text(good + "\n" + good[: len(good) // 2])
    items = list(read_captured(tmp_path))
    bad = [i for i in items if isinstance(i, MalformedLine)]
    assert [type(i).__name__ for i in items] == [
        "CapturedRequest",
        "MalformedLine",
        "CapturedRequest",
        "MalformedLine",
    ]
    assert [b.line for b in bad] == [3, 5]
    assert bad[0].reason.startswith("capture-1.jsonl line 3: ")
    assert bad[1].reason.startswith("capture-2.jsonl line 2: Invalid JSON")


def test_directory_truncated_gzip_then_next_file(tmp_path: Path, keys: Keys) -> None:
    """A truncated archive ends its own file with one malformed line; the next file is still read."""
    good = (_dir_line(keys, "r-1") + "\n").encode()
    data = gzip.compress(good * 50)
    (tmp_path / "a.jsonl.gz").write_bytes(data[: len(data) // 2])
    (tmp_path / "b.jsonl").write_bytes(good)
    items = list(read_captured(tmp_path))
    cut = [i for i in items if isinstance(i, MalformedLine)]
    assert len(cut) == 1 and cut[0].reason.startswith("a.jsonl.gz line ")
    assert "cannot read further" in cut[0].reason
    assert isinstance(items[-1], CapturedRequest) and items[-1].request_id == "r-1"
    assert cut[0].line == len(items) - 1 and f"line {cut[0].line}: " in cut[0].reason


def test_directory_without_capture_files_is_an_input_error(tmp_path: Path) -> None:
    """A directory with no *.jsonl / *.jsonl.gz file is an InputError naming it."""
    (tmp_path / "notes.txt").write_text("x\n")
    with pytest.raises(InputError, match=r"no capture files \(\*\.jsonl, \*\.jsonl\.gz\) in ") as e:
        list(read_captured(tmp_path))
    assert str(tmp_path) in str(e.value)
