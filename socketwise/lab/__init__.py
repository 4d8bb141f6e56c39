"""Development apart from the product: nspawn lab machines and the tiny test model."""
