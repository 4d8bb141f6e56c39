"""Write a Llama checkpoint (safetensors and a byte-level BPE tokenizer.json) as a GGUF file.

llama.cpp serves GGUF, not Hugging Face folders. Its own converter
(``convert_hf_to_gguf.py``) needs torch and transformers and refuses every BPE
tokenizer whose pre-tokenizer it does not know by hash, which is the case of the kit's
tiny model (socketwise.lab.tinymodel), so this writes the file itself with the ``gguf``
package, as the converter would for a Llama:

- weights as float32 (bfloat16 widened exactly), the Hugging Face names mapped to
  llama.cpp's (``blk.N.attn_q.weight`` ...), Q and K permuted to llama.cpp's rotary
  layout exactly as the converter's ``LlamaModel.permute`` does;
- the vocabulary as ``gpt2`` tokens with merges, special tokens marked as control, the
  chat template carried over.

``python -m socketwise.build.ggufmodel MODEL_DIR OUT.gguf`` writes OUT.gguf once: a file
whose metadata names the same source checkpoint (sha256 of model.safetensors) is left
alone. Only Llama checkpoints of one safetensors file with BF16, F16 or F32 tensors are
accepted; anything else is refused with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import sys
from pathlib import Path

import numpy as np

from socketwise.common.files import sha256
from socketwise.plan.modelfile import GgufError, describe

SOURCE_KEY = "socketwise.source_sha256"
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}
_FEED_FORWARD = re.compile(r"\.ffn_(gate|up|down)\.weight$")


class ConvertError(GgufError):
    pass


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of one safetensors file as a float32 array (numpy has no bfloat16)."""
    with path.open("rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
        data = handle.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ConvertError(f"{path}: tensor {name} is {info['dtype']}; only BF16, F16, F32")
        start, end = info["data_offsets"]
        raw = np.frombuffer(data[start:end], dtype=_DTYPES[info["dtype"]])
        if info["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = raw.astype(np.float32).reshape(info["shape"])
    return tensors


def permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face's rotary halves to llama.cpp's interleaved pairs (the converter's own)."""
    shape = weight.shape
    return (
        weight.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
    )


def gguf_name(name: str) -> str:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in _LAYER_NAMES:
        return f"blk.{parts[2]}.{_LAYER_NAMES[parts[3]]}"
    raise ConvertError(f"tensor {name} has no llama.cpp name (not a plain Llama checkpoint)")


def _vocabulary(model_dir: Path) -> tuple[list[str], list[int], list[str], dict]:
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    model = tokenizer["model"]
    if model.get("type") != "BPE" or (tokenizer.get("pre_tokenizer") or {}).get("type") != (
        "ByteLevel"
    ):
        raise ConvertError(f"{model_dir}/tokenizer.json: only byte-level BPE tokenizers")
    by_id = {index: token for token, index in model["vocab"].items()}
    for added in tokenizer.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
    tokens = [by_id[index] for index in range(len(by_id))]
    special = {added["content"] for added in tokenizer.get("added_tokens", []) if added["special"]}
    # 1 normal, 2 unknown, 3 control (gguf.TokenType)
    types = [
        (2 if token == "<unk>" else 3) if token in special else 1 for token in tokens
    ]  # fmt: skip
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    return tokens, types, merges, config


def convert(model_dir: Path, out: Path, experts: int = 0) -> Path:
    """Write OUT from MODEL_DIR unless OUT already came from the same checkpoint (and the
    same `experts`). With `experts`, OUT is a mixture of experts as llama.cpp runs
    Mixtral: every layer's feed-forward becomes that many copies of itself behind a router
    of zeros, which picks two with equal weights, so the model answers exactly as the
    dense one does; the hybrid layout's lab model, whose experts --n-cpu-moe places."""
    import gguf  # the controller's venv; imported here so the module lists without it

    model_dir, out = Path(model_dir), Path(out)
    weights = model_dir / "model.safetensors"
    if not weights.is_file():
        raise ConvertError(f"{model_dir}: no model.safetensors (one-file checkpoints only)")
    source = sha256(weights) + (f"+{experts}-experts" if experts else "")
    if out.is_file():
        field = gguf.GGUFReader(out).get_field(SOURCE_KEY)
        if field is not None and field.contents() == source:
            return out
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise ConvertError(f"{model_dir}: model_type {config.get('model_type')!r}, not llama")
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    theta = (config.get("rope_parameters") or {}).get("rope_theta") or config.get(
        "rope_theta", 10000.0
    )
    tokens, types, merges, tok_config = _vocabulary(model_dir)
    ids = {token: index for index, token in enumerate(tokens)}

    partial = out.with_name(out.name + ".partial")
    writer = gguf.GGUFWriter(partial, "llama")
    writer.add_name(model_dir.name)
    writer.add_string(SOURCE_KEY, source)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(float(theta))
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(min(2, experts))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for role, add in (
        ("bos_token", writer.add_bos_token_id),
        ("eos_token", writer.add_eos_token_id),
        ("pad_token", writer.add_pad_token_id),
        ("unk_token", writer.add_unk_token_id),
    ):
        if tok_config.get(role) in ids:
            add(ids[tok_config[role]])
    writer.add_add_bos_token(True)
    template = model_dir / "chat_template.jinja"
    if template.is_file():
        writer.add_chat_template(template.read_text())
    for name, tensor in read_safetensors(weights).items():
        if name.endswith("q_proj.weight"):
            tensor = permute(tensor, heads)
        elif name.endswith("k_proj.weight"):
            tensor = permute(tensor, kv_heads)
        named = gguf_name(name)
        if experts and _FEED_FORWARD.search(named):
            # blk.N.ffn_up.weight -> blk.N.ffn_up_exps.weight, one copy per expert.
            named = named.replace(".weight", "_exps.weight")
            tensor = np.stack([tensor] * experts)
            if named.endswith("ffn_up_exps.weight"):
                router = named.replace("ffn_up_exps", "ffn_gate_inp")
                writer.add_tensor(router, np.zeros((experts, tensor.shape[2]), np.float32))
        writer.add_tensor(named, np.ascontiguousarray(tensor))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(partial, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m socketwise.build.ggufmodel",
        description="Write a Llama checkpoint as a GGUF file for llama.cpp (once), or with "
        "--info read one; print its path, layers and size as JSON.",
    )
    parser.add_argument("model_dir", type=Path, nargs="?")
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--info", type=Path, metavar="GGUF")
    parser.add_argument(
        "--experts", type=int, default=0, help="write a mixture of this many experts per layer"
    )
    args = parser.parse_args(argv)
    if not args.info and not (args.model_dir and args.out):
        parser.error("give MODEL_DIR OUT, or --info GGUF")
    try:
        print(json.dumps(describe(args.info or convert(args.model_dir, args.out, args.experts))))
    except (GgufError, OSError, KeyError) as exc:
        print(f"socketwise: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
