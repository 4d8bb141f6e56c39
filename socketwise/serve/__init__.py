"""Stage 4, serve: checks of the running services against the plan (runs on hosts, stdlib only)."""
