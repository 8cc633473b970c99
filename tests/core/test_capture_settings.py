"""The hook's capture settings: the sample rate is chosen, never defaulted; size and age are capped."""

from __future__ import annotations

import pytest

from engine_hooks.core.policies import open_capture
from engine_hooks.core.settings import HookConfigError, HookSettings
from tests.core.files import HookFiles


def test_a_capture_directory_without_a_rate_is_refused(hook_files: HookFiles) -> None:
    """SEMGOV_CAPTURE_DIR without SEMGOV_CAPTURE_RATE is refused, naming the rate: a capture is
    personal data and how much of it to keep is the operator's choice."""
    env = hook_files.env(SEMGOV_CAPTURE_DIR=str(hook_files.dir / "cap"))
    with pytest.raises(HookConfigError, match="SEMGOV_CAPTURE_RATE is not"):
        HookSettings.from_env(env)


def test_the_capture_caps_have_defaults_and_reach_the_writer(hook_files: HookFiles) -> None:
    """Without settings a capture keeps at most 1 GiB and 7 days; the variables change both."""
    s = HookSettings.from_env(
        hook_files.env(SEMGOV_CAPTURE_DIR=str(hook_files.dir / "cap"), SEMGOV_CAPTURE_RATE="0.01")
    )
    assert (s.capture_rate, s.capture_max_total_mb, s.capture_max_age_h) == (0.01, 1024, 168)
    s = HookSettings.from_env(
        hook_files.env(
            SEMGOV_CAPTURE_DIR=str(hook_files.dir / "cap"),
            SEMGOV_CAPTURE_RATE="1",
            SEMGOV_CAPTURE_MAX_TOTAL_MB="256",
            SEMGOV_CAPTURE_MAX_AGE_H="24",
        )
    )
    w = open_capture(s)
    assert w is not None
    try:
        assert (w.max_total_bytes, w.max_age_s) == (256 << 20, 86400.0)
    finally:
        w.close()


@pytest.mark.parametrize(
    ("over", "name"),
    [
        ({"SEMGOV_CAPTURE_MAX_TOTAL_MB": "32"}, "SEMGOV_CAPTURE_MAX_TOTAL_MB"),  # NOTE: below one 64 MiB file
        ({"SEMGOV_CAPTURE_MAX_AGE_H": "0"}, "SEMGOV_CAPTURE_MAX_AGE_H"),
    ],
)
def test_bad_capture_caps_are_refused(hook_files: HookFiles, over: dict[str, str], name: str) -> None:
    """A total cap below one capture file, or an age cap under an hour, is refused naming the variable."""
    env = hook_files.env(SEMGOV_CAPTURE_DIR=str(hook_files.dir / "cap"), SEMGOV_CAPTURE_RATE="1", **over)
    with pytest.raises(HookConfigError, match=name):
        HookSettings.from_env(env)
