"""torchtitan on CPU, for the test suite only: torchtitan trains on accelerators (it falls back to
``cuda`` when none is found, asks the device for its name and memory, and its FlexAttention has no
backward on CPU), and torchtitan 0.3.0 calls ``torch.distributed.set_timeout``, which PyTorch
2.13 does not have yet (torchtitan asks for a nightly). Nothing here is part of sres or of what a
user runs on a GPU cluster.

:func:`install` must run before torchtitan is imported: it makes ``cpu`` the device torchtitan
finds, gives ``torch.cpu`` the few device queries it makes (``current_device`` an index, as its
barrier's ``device_ids`` wants), and runs FlexAttention's mask as an explicit mask in PyTorch's
scaled dot-product attention (the same attention, eager, differentiable on CPU).
"""

from __future__ import annotations

import types

import torch
import torch._utils
import torch.nn.functional as F


def install() -> None:
    """Nothing where a GPU is found: torchtitan runs as it is there."""
    if torch.cuda.is_available():
        return
    torch._utils._get_available_device_type = lambda: "cpu"
    queries = {
        "get_device_name": lambda *_: "cpu",
        "get_device_properties": lambda *_: types.SimpleNamespace(total_memory=1 << 34),
        "reset_peak_memory_stats": lambda *_: None,
        "empty_cache": lambda *_: None,
        "memory_stats": lambda *_: {},
    }
    for name, query in queries.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, query)
    torch.cpu.current_device = lambda: 0  # type: ignore[assignment]
    if not hasattr(torch.distributed, "set_timeout"):
        from torch.distributed.distributed_c10d import _set_pg_timeout

        torch.distributed.set_timeout = lambda timeout, group=None: _set_pg_timeout(timeout, group)

    from torch.nn.attention.flex_attention import create_mask
    from torchtitan.models.common.attention import FlexAttention

    def eager_flex(q, k, v, *, score_mod, block_mask, scale, enable_gqa, return_aux, kernel_options):
        if score_mod is not None or return_aux.lse:
            raise NotImplementedError("tests.models.titan_cpu: score_mod and lse are not needed here")
        mask = create_mask(block_mask.mask_mod, q.shape[0], 1, q.shape[2], k.shape[2], device=q.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
        return out, None

    FlexAttention._compiled_flex_attn = staticmethod(eager_flex)
