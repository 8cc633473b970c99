"""The connector's copy protocol for GPU workers (engine_hooks.vllm.device_copies), tested on CPU
with streams whose events complete only when a test says so: nothing is reported complete before
its copies are, every wait is a device-side one (never the host), loads are checked before
anything is enqueued, and dropped entries outlive their copies (issue 33)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
import torch

from engine_hooks.core.rope import RopeSpec
from engine_hooks.core.rotation import rerotate_keys
from engine_hooks.vllm.device_copies import CopyEngine, ImmediateStreams
from engine_hooks.vllm.device_layout import DeviceLayout, flash_reference_writer, learn_device_layout

H, D, N, BLOCKS = 2, 16, 16, 8
ROPE = RopeSpec(rotary_dim=D, head_dim=D, base=10000.0, is_neox_style=True)


class _Event:
    def __init__(self, name: str) -> None:
        self.name, self.complete = name, False


class ManualStreams:
    """Records what the engine enqueues; events complete when the test calls :meth:`finish`."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.events: list[_Event] = []

    def on(self, name: str) -> AbstractContextManager[Any]:
        self.log.append(f"on:{name}")
        return nullcontext()

    def after_compute(self, name: str) -> None:
        self.log.append(f"after_compute:{name}")

    def record(self, name: str) -> Any:
        self.events.append(_Event(name))
        self.log.append(f"record:{name}")
        return self.events[-1]

    def compute_waits(self, event: Any) -> None:
        self.log.append(f"compute_waits:{event.name}")

    def done(self, event: Any) -> bool:
        return bool(event.complete)

    def finish(self) -> None:
        for e in self.events:
            e.complete = True


def _setup(streams: Any) -> tuple[CopyEngine, DeviceLayout, dict[str, torch.Tensor]]:
    """Two NHD layers of BLOCKS blocks (float32), written with random K/V at every slot."""
    caches = {
        f"l{i}": torch.zeros(BLOCKS, N, H, 2 * D).transpose(1, 2) for i in range(2)
    }  # [B, H, N, 2D] views in NHD order
    write = flash_reference_writer(D)
    layout = learn_device_layout(write, caches["l0"], H, D, "FLASH_ATTN")
    g = torch.Generator().manual_seed(0)
    for c in caches.values():
        slots = torch.arange(BLOCKS * N)
        write(
            torch.randn(slots.numel(), H, D, generator=g),
            torch.randn(slots.numel(), H, D, generator=g),
            c,
            slots,
        )
    return CopyEngine(layout, caches, streams, rope=ROPE), layout, caches


def test_a_donor_is_complete_only_when_every_save_event_is() -> None:
    """A donor is reported complete once, only after every save event of it completed."""
    s = ManualStreams()
    eng, layout, caches = _setup(s)
    slots = torch.arange(16, 16 + 40)
    eng.save("d", slots[:24], 0, 40)
    assert eng.poll() == []
    eng.save("d", slots[24:], 24, 40)
    s.events[0].complete = True
    assert eng.poll() == []  # the second save is still in flight
    s.finish()
    assert eng.poll() == ["d"] and eng.poll() == []
    for i, c in enumerate(caches.values()):
        assert torch.equal(eng.entries["d"].rows[i], layout.gather(c, slots))


def test_a_save_follows_the_forward_and_later_compute_work_waits_for_it_on_the_device() -> None:
    """A save waits for the forward on the device; the compute stream then waits for the save."""
    s = ManualStreams()
    eng, _, _ = _setup(s)
    eng.save("d", torch.arange(8), 0, 8)
    assert s.log == ["after_compute:save", "on:save", "record:save", "compute_waits:save"]


def test_a_dropped_entry_outlives_its_copies_in_flight() -> None:
    """A dropped entry with a save in flight is kept until its event completes, then freed."""
    s = ManualStreams()
    eng, _, _ = _setup(s)
    eng.save("d", torch.arange(8), 0, 8)
    eng.drop("d")
    assert "d" not in eng.entries and len(eng.retiring) == 1
    assert eng.poll() == [] and len(eng.retiring) == 1
    s.finish()
    assert eng.poll() == [] and eng.retiring == []


def test_a_shifted_load_lands_re_rotated_and_the_forward_waits_for_it() -> None:
    """A shifted load lands re-rotated, leaves the stored rows as they were, and the forward waits."""
    s = ManualStreams()
    eng, layout, caches = _setup(s)
    donor = torch.arange(0, 32)
    eng.save("d", donor, 0, 32)
    s.finish()
    assert eng.poll() == ["d"]
    stored = [r.clone() for r in eng.entries["d"].rows]
    dest = torch.arange(5 * N + 5, 5 * N + 5 + 32)
    eng.load("d", [(dest, 0, 5)])
    assert s.log[-4:] == ["after_compute:load", "on:load", "record:load", "compute_waits:load"]
    for i, c in enumerate(caches.values()):
        got = layout.gather(c, dest)
        assert torch.equal(got[:, 1], stored[i][:, 1])
        want = rerotate_keys(stored[i][:, 0], torch.full((32,), 5), ROPE)
        assert torch.equal(got[:, 0], want) and not torch.equal(got[:, 0], stored[i][:, 0])
        assert torch.equal(eng.entries["d"].rows[i], stored[i])


@pytest.mark.parametrize(
    ("case", "why"),
    [("incomplete", "not complete"), ("too_long", "holds 32"), ("outside", "outside"), ("no_rope", "RoPE")],
)
def test_a_load_is_refused_before_anything_is_enqueued(case: str, why: str) -> None:
    """A load that cannot be done is refused before any work is enqueued; caches stay unchanged."""
    s = ManualStreams()
    eng, _, caches = _setup(s)
    eng.save("d", torch.arange(32), 0, 32)
    if case != "incomplete":
        s.finish()
        eng.poll()
    if case == "no_rope":
        eng.rope = None
    before = [c.clone() for c in caches.values()]
    dest = {
        "too_long": torch.arange(64, 104),  # 40 positions of a 32-position donor
        "outside": torch.arange(BLOCKS * N - 8, BLOCKS * N + 8),
    }.get(case, torch.arange(64, 80))
    with pytest.raises(RuntimeError, match=why):
        eng.load("d", [(dest, 0, 3)])
    assert "on:load" not in s.log and "after_compute:load" not in s.log
    assert all(torch.equal(a, b) for a, b in zip(before, caches.values(), strict=True))


def test_on_one_in_order_device_copies_are_complete_at_once() -> None:
    """On an in-order device (CPU) a save is complete at the next poll."""
    eng, _, _ = _setup(ImmediateStreams())
    eng.save("d", torch.arange(8), 0, 8)
    assert eng.poll() == ["d"]
