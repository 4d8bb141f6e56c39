"""Stage 3, host: the kernel tuned for the plan (runs on hosts, stdlib only)."""
