"""The MLP example behind a heavy import at the top (``transformers``' GPT-2), as users' scripts have:
each process that runs this module's top writes its slot, pid and import time to
``$HEAVY_IMPORTS_LOG``. A rank forked from its fork server never runs it."""

from __future__ import annotations

import os
import time

t0 = time.monotonic()
from transformers import GPT2LMHeadModel  # noqa: E402,F401 - the point: seconds of imports before resilience.run

with open(os.environ["HEAVY_IMPORTS_LOG"], "a") as log:
    log.write(f"{os.environ.get('SRES_SLOT', '-')} {os.getpid()} {time.monotonic() - t0:.3f}\n")

from resilience.examples.train_mlp import main  # noqa: E402

if __name__ == "__main__":
    main()
