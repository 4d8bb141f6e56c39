"""What the planners need of a model file: a GGUF's size, layers, KV cache per token and
experts, read with the `gguf` package (`socketwise plan --gguf`, and the cluster role
through `python -m socketwise.build.ggufmodel --info`)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

# A layer's routed experts, stacked (llama.cpp's LLM_TENSOR_FFN_*_EXPS; the shared
# experts, *_shexp, are not among them).
_EXPERTS = re.compile(r"blk\.(\d+)\.ffn_(?:gate|up|down|gate_up)_exps\.weight")


class GgufError(ValueError):
    """A file that is not a GGUF llama.cpp could describe; the message names it."""


def describe(path: Path) -> dict:
    """What the planners need of a GGUF file: its path, layers and size in GB, and for a
    mixture of experts, the experts' share (`expert_gb`, the routed experts' tensors,
    which llama.cpp's --n-cpu-moe keeps in system memory) and the layers before the first
    that has experts (`dense_layers`; all of them when none has)."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise GgufError(f"{path}: no such file")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, struct.error) as exc:
        raise GgufError(f"{path}: not a GGUF file ({exc})") from exc
    arch = reader.get_field("general.architecture")
    blocks = reader.get_field(f"{arch.contents()}.block_count") if arch else None
    if blocks is None:
        raise GgufError(f"{path}: no block count (general.architecture and its block_count)")
    layers = int(blocks.contents())
    experts = [
        (int(match[1]), int(tensor.n_bytes))
        for tensor in reader.tensors
        if (match := _EXPERTS.fullmatch(tensor.name))
    ]
    return {
        "path": str(path.resolve()),
        "layers": layers,
        "gb": round(path.stat().st_size / 2**30, 3),
        "kv_bytes_per_token": _kv_bytes_per_token(reader, arch.contents(), layers),
        "expert_gb": round(sum(size for _, size in experts) / 2**30, 3),
        "dense_layers": min((layer for layer, _ in experts), default=layers),
    }


def _kv_bytes_per_token(reader, arch: str, layers: int) -> int:
    """What one token of llama.cpp's KV cache takes over every layer: a key and a value per
    KV head, f16 (llama-server's default cache type). A field the file lacks takes
    llama.cpp's default (KV heads: the heads; key and value length: embedding / heads);
    a per-layer head count is summed. Sizes the cluster's units (socketwise.serve.limits)."""

    def field(key: str):
        found = reader.get_field(f"{arch}.{key}")
        return None if found is None else found.contents()

    embedding = int(field("embedding_length") or 0)
    heads = field("attention.head_count") or 1
    kv_heads = field("attention.head_count_kv") or heads
    if not isinstance(heads, list):
        heads = [heads] * layers
    if not isinstance(kv_heads, list):
        kv_heads = [kv_heads] * layers
    per_token = 0
    for layer_heads, layer_kv_heads in zip(heads, kv_heads, strict=True):
        head_dim = embedding // max(int(layer_heads), 1)
        key = int(field("attention.key_length") or head_dim)
        value = int(field("attention.value_length") or head_dim)
        per_token += int(layer_kv_heads) * (key + value)
    return 2 * per_token
