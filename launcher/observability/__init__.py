"""What a run leaves to read: ``events`` (events.jsonl, the record every reader shares), ``goodput``,
``metrics`` (Prometheus), ``report`` and ``report_plots`` (``sres report``), ``straggler`` (slow-rank
verdicts), ``simulate`` (goodput at scale from a run's own numbers). Torch-free.
"""
