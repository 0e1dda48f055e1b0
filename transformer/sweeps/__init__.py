"""A sweep's execution: runs trained in process, in worker processes or on SLURM (runner, execute, run_groups,
slurm), their claims and results (DIR/results.jsonl exactly once), progress and the outcome (fit, prediction
check). Above training (it trains runs) and below experiments/ (the command lines); the design it executes is
transformer/design/."""
