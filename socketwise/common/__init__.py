"""Shared by every stage: where the cache and the checkout are, atomic file publishing,
HTTP to the kit's own endpoints."""
