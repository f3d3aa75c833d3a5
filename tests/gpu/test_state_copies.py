"""CUDA model and optimizer state through the tiers: commit blocking against the D2H floor and
``dcp.async_save``, RAM-tier restore to the GPU against ``torch.load`` + ``.cuda()``
(``benchmarks/gpu_state.py``, run here at the sizes run.sh names; 1 and 8 GiB by default).

Asserted: every restored tensor is bitwise the one saved. Measured, not asserted (targets of
issue 55, a shared machine's timings are not a test): the ratios, as figures.
"""

from __future__ import annotations

import os

from benchmarks import gpu_state


def test_cuda_state_through_the_tiers_comes_back_bitwise_and_its_costs_are_measured(figures, tmp_path):
    sizes = os.environ.get("SRES_GPU_SIZES", "1024,8192")
    repeat = os.environ.get("SRES_GPU_REPEAT", "3")
    summary = gpu_state.main(
        ["--device", "cuda", "--sizes", sizes, "--repeat", repeat, "--dir", str(tmp_path)]
    )
    figures("device", summary["device"])
    for mib, row in summary["sizes"].items():
        for name, value in row.items():
            figures(f"{mib} MiB: {name}", value, "" if "/" in name or name in ("bytes", "exact") else "s")
    assert all(row["exact"] == 1.0 for row in summary["sizes"].values()), summary
