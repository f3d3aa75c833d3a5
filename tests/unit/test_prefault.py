"""Receive buffers mapped ahead of the data never change a byte of it."""

from __future__ import annotations

import torch

from resilience.state import prefault


def test_mapping_pages_ahead_leaves_every_byte_already_written_as_it_was():
    buf = torch.empty(3 * prefault.STEP // 4 + 123)  # float32: 3 steps and a bit, pages half-written
    buf[: buf.numel() // 2] = torch.arange(buf.numel() // 2, dtype=torch.float32)
    prefault.ahead([buf, torch.empty(0)]).join()
    assert torch.equal(buf[: buf.numel() // 2], torch.arange(buf.numel() // 2, dtype=torch.float32))
    buf[buf.numel() // 2 :] = 7.0  # the rest is writable memory
    assert float(buf[-1]) == 7.0
