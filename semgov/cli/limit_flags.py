"""The ``--max-*`` resource-limit flags every command that reads policies or captures shares
(docs/limits.md); light, so a command's ``--help`` needs nothing else."""

from __future__ import annotations

import argparse

from semgov.intake.limits import SETTINGS, Limits, positive_int_arg


def add_limit_flags(p: argparse.ArgumentParser, fields: tuple[str, ...] | None = None) -> None:
    """``--max-*`` flags for the limits in ``fields`` (every limit that has a flag when None)."""
    g = p.add_argument_group("resource limits (flag > environment variable > default)")
    default = Limits()
    for s in SETTINGS:
        if s.flag is None or (fields is not None and s.field not in fields):
            continue
        g.add_argument(
            s.flag,
            dest=s.field,
            type=positive_int_arg,
            metavar="N",
            help=f"{s.help} (default {getattr(default, s.field)} {s.unit}; environment {s.env})",
        )


def limits_from_args(args: argparse.Namespace) -> Limits:
    """The environment's limits, overridden by the ``--max-*`` flags given."""
    return Limits.from_env().with_overrides(
        **{s.field: getattr(args, s.field, None) for s in SETTINGS if s.flag is not None}
    )
