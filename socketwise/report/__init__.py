"""Stage 6, report: the decisions from a run directory, and their rendering."""
