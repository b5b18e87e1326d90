"""Long loops cut into time slices: other tasks run once per slice of the loop's own work."""

from __future__ import annotations

import trio.testing

from proxy.timeslice import TimeSlices


async def test_a_loop_checkpoints_once_a_slice_of_work_is_done_and_not_before():
    now = {"t": 0.0}
    slices = TimeSlices(1.0, clock=lambda: now["t"])
    for item in range(1, 11):
        now["t"] += 0.25  # each item: a quarter of a slice of work
        # A checkpoint once a slice of work is done, then a slice after it: after items 4 and 8.
        with trio.testing.assert_checkpoints() if item in (4, 8) else trio.testing.assert_no_checkpoints():
            await slices.pause_if_due()
