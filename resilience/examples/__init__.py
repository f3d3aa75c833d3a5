"""Small, real training scripts used by ``sres demo``, the tests and the benchmarks."""
