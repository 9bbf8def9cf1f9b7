#!/usr/bin/env python3
"""Writes a sharded bf16 checkpoint of Qwen3-30B-A3B's published shape (about 61 GB, zeros: the
values do not matter for what is measured, but every byte is written: no sparse holes), for the
resident-memory check of a model placed on the GPU (bench/gpu.sh with R3_RESIDENT_MEMORY=1):
`r3 generate --device cuda` on it logs the host memory the process still holds once the weights
are on the device. Plain Python (the safetensors layout: an 8-byte header length, the JSON header,
the data). Usage: resident_memory.py --out DIR [--layers N]"""
import argparse
import json
import math
import os
import struct

ZEROS = bytes(64 << 20)


def write_shard(path, tensors):
    """tensors: [(name, shape)], all bf16 zeros, in this order."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        n = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        left = offset
        while left > 0:
            f.write(ZEROS[: min(left, len(ZEROS))])
            left -= min(left, len(ZEROS))
    return offset

# Qwen3-30B-A3B's config.json, as published.
CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
    "decoder_sparse_step": 1, "dtype": "bfloat16", "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960, "mlp_only_layers": [],
    "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "sliding_window": None,
    "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936,
}


def layer_shapes(c, l):
    h, hd, e, w = c["hidden_size"], c["head_dim"], c["num_experts"], c["moe_intermediate_size"]
    p = f"model.layers.{l}."
    yield p + "input_layernorm.weight", [h]
    yield p + "post_attention_layernorm.weight", [h]
    yield p + "self_attn.q_proj.weight", [c["num_attention_heads"] * hd, h]
    yield p + "self_attn.k_proj.weight", [c["num_key_value_heads"] * hd, h]
    yield p + "self_attn.v_proj.weight", [c["num_key_value_heads"] * hd, h]
    yield p + "self_attn.o_proj.weight", [h, c["num_attention_heads"] * hd]
    yield p + "self_attn.q_norm.weight", [hd]
    yield p + "self_attn.k_norm.weight", [hd]
    yield p + "mlp.gate.weight", [e, h]
    for x in range(e):
        yield p + f"mlp.experts.{x}.gate_proj.weight", [w, h]
        yield p + f"mlp.experts.{x}.up_proj.weight", [w, h]
        yield p + f"mlp.experts.{x}.down_proj.weight", [h, w]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"])
    ap.add_argument("--shard-bytes", type=float, default=4e9)
    a = ap.parse_args()
    c = dict(CONFIG, num_hidden_layers=a.layers)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    shapes = [("model.embed_tokens.weight", [c["vocab_size"], c["hidden_size"]])]
    for l in range(a.layers):
        shapes += list(layer_shapes(c, l))
    shapes += [("model.norm.weight", [c["hidden_size"]]), ("lm_head.weight", [c["vocab_size"], c["hidden_size"]])]
    shards, shard, size = [], [], 0
    for name, shape in shapes:
        n = 2 * math.prod(shape)
        if shard and size + n > a.shard_bytes:
            shards.append(shard)
            shard, size = [], 0
        shard.append((name, shape))
        size += n
    shards.append(shard)
    weight_map, total = {}, 0
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(os.path.join(a.out, file), names)
        for name, _ in names:
            weight_map[name] = file
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    print(f"resident_memory.py: {len(shapes)} tensors, {total / 1e9:.1f} GB in {len(shards)} shards under {a.out}")


if __name__ == "__main__":
    main()
