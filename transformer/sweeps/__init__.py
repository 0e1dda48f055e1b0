"""Sweeps: a sweep config expanded into runs (grid), their execution and bookkeeping (runner, run_groups,
claims, results). Above training (it trains runs) and below experiments/ (the command lines)."""
