"""Stage 5, measure: sweeps, the benchmark runner and power meter (on hosts), run directories."""
