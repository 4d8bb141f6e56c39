"""socketwise: place vLLM on CPU servers by their NUMA topology, deploy it, measure it."""

__version__ = "0.1.0"
