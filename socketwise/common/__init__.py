"""Shared by every stage: where the cache and the checkout are, atomic file publishing."""
