"""Stage 2, plan: where every vLLM rank runs, from the facts (plain Python, stdlib only)."""
