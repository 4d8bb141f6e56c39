"""Generate socketwise's default model: a tiny random Llama that vLLM CPU serves.

Offline and deterministic. A byte-level BPE tokenizer is trained with `tokenizers`
on a corpus built here in code (no downloads); a 4-layer, 256-wide
``LlamaForCausalLM`` is initialised from a fixed seed and saved as safetensors in
bfloat16, the dtype the servers run with (``--dtype bfloat16``). Its output is
random text, which is all a placement/throughput test needs: it exercises the
whole serving path (tokenizer, chat template, KV cache, sampling, detokenizer).

``--size`` picks a preset (``PRESETS``): ``tiny`` (the default, 7 MB, lives in the
cache, so decode is bound by the cores), or ``0.5g`` and ``1g``, Llamas 2048 wide with
about 0.5 and 1 GB of bf16 weights, too large for any cache: decode at concurrency 1
then reads every weight from memory once per token, and memory bandwidth bounds it
(the report's roofline). Same tokenizer, seed and determinism for every preset.

Run it from the checkout with the Python of the vLLM venv (which has torch,
transformers and tokenizers)::

    VENV/bin/python -m socketwise.lab.tinymodel OUT_DIR

The controller can import it without torch (heavy imports happen inside
``generate``) to call ``is_complete``.

Idempotent: OUT_DIR is complete when its marker ``socketwise-model.json`` exists and
every file it lists has its recorded size; then nothing is done. The model is built
in a staging directory beside OUT_DIR and swapped in whole. A non-empty OUT_DIR
without our marker is never overwritten unless ``force=True`` (``--force``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from socketwise.common.files import building, publish, read_json, sha256

MARKER = "socketwise-model.json"
MARKER_VERSION = 1
SERVED_NAME = "tiny-llama"
SEED = 1234
VOCAB_TARGET = 1024
MAX_POSITIONS = 2048
DTYPE = "bfloat16"


@dataclass(frozen=True)
class Preset:
    """The shape of one model size; key/value heads divisible by 2 (tensor parallel 2)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int

    def parameters(self, vocab: int) -> int:
        """Weights of a Llama this shape with untied embeddings, as torch counts them."""
        head_dim = self.hidden // self.heads
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * head_dim
        mlp = 3 * self.hidden * self.intermediate
        layer = attention + mlp + 2 * self.hidden  # two RMS norms
        return self.layers * layer + 2 * vocab * self.hidden + self.hidden


# "tiny" is the built-in model every lab test serves: changing it changes their bytes.
PRESETS = {
    "tiny": Preset(hidden=256, intermediate=768, layers=4, heads=4, kv_heads=2),
    "0.5g": Preset(hidden=2048, intermediate=5632, layers=5, heads=16, kv_heads=8),
    "1g": Preset(hidden=2048, intermediate=5632, layers=10, heads=16, kv_heads=8),
}
DEFAULT_PRESET = "tiny"

BOS, EOS, UNK, PAD = "<s>", "</s>", "<unk>", "<pad>"
SPECIAL_TOKENS = [BOS, EOS, UNK, PAD]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_SENTENCES = (
    "A server with two sockets has two memory controllers and two caches.",
    "Each socket reads its own memory faster than the memory of the other socket.",
    "The scheduler moves threads between cores when the load changes.",
    "A language model reads a prompt and writes one token at a time.",
    "Every new token needs the weights of the model to pass through the cores.",
    "When the weights are large, the speed of memory sets the speed of the model.",
    "Small models live in the cache and run as fast as the cores allow.",
    "The operator pins each worker to the cores of one node and its local memory.",
    "A balancer spreads the requests over the workers and checks their health.",
    "The benchmark sends many prompts at once and counts the tokens per second.",
    "Latency is the time to the first token; throughput is tokens over time.",
    "Good placement keeps the threads, the memory and the interrupts together.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Questions and answers, lists and numbers: one, two, three, four, five, six.",
    "She said that the plan was simple, and he agreed that it would work.",
    "What time is it? It is ten past nine in the morning, on a cold day in May.",
)


def corpus(seed: int = SEED, rounds: int = 24) -> list[str]:
    """About 25 KB of plain English: the built-in sentences, permuted per round."""
    rng = random.Random(seed)
    lines = []
    for _ in range(rounds):
        order = list(_SENTENCES)
        rng.shuffle(order)
        lines.append(" ".join(order[: rng.randint(4, len(order))]))
        lines.extend(order)
    return lines


def read_marker(out_dir: Path) -> dict | None:
    return read_json(Path(out_dir) / MARKER)


def is_complete(out_dir: Path) -> bool:
    """True when OUT_DIR holds a finished model from this module (sizes checked)."""
    marker = read_marker(out_dir)
    if not marker or marker.get("version") != MARKER_VERSION or not marker.get("files"):
        return False
    for name, info in marker["files"].items():
        path = Path(out_dir) / name
        if not path.is_file() or path.stat().st_size != info.get("size"):
            return False
    return True


def _train_tokenizer(seed: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def _build(staging: Path, seed: int, preset: str) -> dict:
    import tokenizers
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = _train_tokenizer(seed)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        model_max_length=MAX_POSITIONS,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(str(staging))
    # transformers 5 writes its own class name ("TokenizersBackend"), which
    # transformers 4 cannot load; the generic fast class loads in both.
    tok_config_path = staging / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_config_path.write_text(json.dumps(tok_config, indent=2, sort_keys=True) + "\n")

    shape = PRESETS[preset]
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=tok.token_to_id(EOS),
        pad_token_id=tok.token_to_id(PAD),
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(getattr(torch, DTYPE)).eval()
    model.config.dtype = DTYPE
    save_kwargs = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        save_kwargs["safe_serialization"] = True  # transformers 4; 5 always saves safetensors
    model.save_pretrained(str(staging), **save_kwargs)
    if not list(staging.glob("*.safetensors")):
        raise RuntimeError("save_pretrained wrote no .safetensors file")

    # save_pretrained leaves the weights 0600: a service user other than the
    # generating one could not read them.
    staging.chmod(0o755)
    for path in staging.iterdir():
        path.chmod(0o644)
    files = {
        p.name: {"size": p.stat().st_size, "sha256": sha256(p)}
        for p in sorted(staging.iterdir())
        if p.is_file()
    }
    return {
        "version": MARKER_VERSION,
        "served_name": SERVED_NAME,
        "preset": preset,
        "architecture": "LlamaForCausalLM",
        "dtype": DTYPE,
        "seed": seed,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": config.vocab_size,
        "max_position_embeddings": MAX_POSITIONS,
        "size_bytes": sum(f["size"] for f in files.values()),
        "config_sha256": files["config.json"]["sha256"],
        "files": files,
        "generated_with": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
    }


def generate(
    out_dir: Path, *, seed: int = SEED, preset: str = DEFAULT_PRESET, force: bool = False
) -> Path:
    """Write the model of PRESET into OUT_DIR (unless it is already complete); return OUT_DIR."""
    if preset not in PRESETS:
        raise ValueError(f"size {preset!r}: choose one of {', '.join(PRESETS)}")
    out_dir = Path(out_dir).resolve()
    if is_complete(out_dir) and not force:
        return out_dir
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and read_marker(out_dir) is None and not force:
        raise FileExistsError(f"{out_dir} is not empty and holds no {MARKER}; use force")

    staging = out_dir.parent / f".{out_dir.name}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    marker = _build(staging, seed, preset)
    return publish(staging, out_dir, MARKER, marker)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m socketwise.lab.tinymodel",
        description="Generate the tiny random Llama that socketwise serves by default.",
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument(
        "--size", choices=PRESETS, default=DEFAULT_PRESET, help="tiny, or 0.5/1 GB of weights"
    )
    parser.add_argument("--force", action="store_true", help="regenerate even if complete")
    args = parser.parse_args(argv)
    with building(args.out_dir):
        was_complete = is_complete(args.out_dir) and not args.force
        out = generate(args.out_dir, seed=args.seed, preset=args.size, force=args.force)
    marker = read_marker(out) or {}
    state = "already complete" if was_complete else "generated"
    print(
        f"{out}: {state}, {marker.get('parameters')} parameters, "
        f"{marker.get('size_bytes')} bytes, {marker.get('dtype')}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
