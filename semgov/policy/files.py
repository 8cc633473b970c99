"""Which files a policy directory is read from: the one list the loaders and the reload watcher share.

Tools leave copies beside the files they write: editors (``.policy.rego.swp``, ``.#policy.rego``,
``policy.rego~``), ``rsync`` and atomic writers (``.policy.yaml.XXXXXX``, ``.policy.yaml.new``),
Kubernetes ConfigMap volumes (the previous and the next version under hidden, timestamped
``..2024_01_01_00_00_00.123/`` directories during an update). A loader that read them would
decide with two versions of a module at once, or with a half-written one. So no hidden entry (a
name starting with ``.``, files and directories alike, at any depth below the policy directory)
and no editor or tool temporary copy (:func:`skipped_name`) is ever read as a policy file.
A path named explicitly (``--policy``, ``SEMGOV_POLICY``, ``SEMGOV_TRUST``) is read as named.
"""

from __future__ import annotations

import os
from pathlib import Path

POLICY_FILE = "policy.yaml"
# NOTE: suffixes editors, patch and download tools give their working copies.
TEMP_SUFFIXES = (".swp", ".swo", ".swx", ".tmp", ".temp", ".bak", ".orig", ".rej", ".part", ".new", ".old")
_MAX_FILES = 10_000  # NOTE: a policy directory is a handful of files; bound the walk anyway


def skipped_name(name: str) -> bool:
    """A hidden entry, or an editor or tool temporary copy: never read as part of a policy."""
    return (
        name.startswith((".", "#", "~")) or name.endswith(("~", "#")) or name.lower().endswith(TEMP_SUFFIXES)
    )


def rego_paths(directory: Path) -> list[Path]:
    """``*.rego`` files at or below ``directory`` (symlinked directories not followed), sorted,
    without hidden entries or temporary copies at any level (at most 10,000 names looked at)."""
    out: list[Path] = []
    seen = 0
    for dirpath, dirnames, names in os.walk(directory):
        dirnames[:] = sorted(d for d in dirnames if not skipped_name(d))
        seen += len(names)
        out += [Path(dirpath) / n for n in names if n.endswith(".rego") and not skipped_name(n)]
        if seen > _MAX_FILES:
            break
    return sorted(out)


def policy_paths(path: Path) -> list[Path]:
    """Every file loading ``path`` reads: the file itself, or a directory's ``policy.yaml`` and its
    ``*.rego`` modules (what exists of them; the loader reports what is missing)."""
    if not path.is_dir():
        return [path]
    yaml_file = path / POLICY_FILE
    return ([yaml_file] if yaml_file.exists() else []) + rego_paths(path)


__all__ = ["TEMP_SUFFIXES", "policy_paths", "rego_paths", "skipped_name"]
