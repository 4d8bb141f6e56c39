"""Stage 3, build: what gets installed on a host (offline wheelhouses), built on the controller."""
