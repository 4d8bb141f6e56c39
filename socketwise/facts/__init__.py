"""Stage 1, facts: what a host is (topology detection; runs on hosts, stdlib only)."""
