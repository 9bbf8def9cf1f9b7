#!/usr/bin/env python3
r"""Regenerate r3 reference fixtures (the format of tests/data/<family>/, see tests/data/README.md).

Builds (or loads) a tiny float32 Hugging Face MoE checkpoint, greedy-generates with transformers
in float32, then runs ONE float64 forward (eager attention, eager experts) over input_ids[:-1] and
writes reference_i.safetensors + reference.json next to the checkpoint.

  python3 tools/make_reference.py --family qwen3_moe --out DIR [--seed 1234] \
      [--config-override key=value ...] [--prompt-lens 12,5] [--gen 8] [--check-rope-scaling]
  python3 tools/make_reference.py --from-checkpoint DIR --out DIR2 [--input-ids-from REFDIR]
  python3 tools/make_reference.py --family deepseek_v3 --out DIR --quantize fp8 --block-size 16,16
  python3 tools/make_reference.py --family gpt_oss --out DIR --quantize mxfp4 \
      --config-override hidden_size=128 intermediate_size=96

--family also takes the names in RELEASED_STYLE (e.g. deepseek_v4_yarn): a tiny config written the way
that family's released checkpoints write config.json; transformers loads the model from that file.

--quantize fp8 --block-size R,C [--scale-dtype float32|bfloat16] writes the checkpoint the way published
FP8 checkpoints are (DeepSeek-V3/R1, Kimi K2, Qwen3 FP8): every projection of the decoder layers (not
the embeddings, lm_head, norms or router gates) becomes F8_E4M3 with `<name>_scale_inv` ([ceil(out/R),
ceil(in/C)], amax/448 per block, partial last blocks allowed), config.json gets the quantization_config.
The references (generate and the float64 forward) are computed by transformers from the DEQUANTIZED
weights (fp8 * scale in float32, written to a temporary float32 checkpoint), which is what r3 computes
with. --from-checkpoint of such a folder dequantizes it the same way. DeepSeek-V4-Flash's layout:
--scale-fmt ue8m0 (power-of-two scales, config scale_fmt "ue8m0") --scale-name scale (`<module>.scale`);
its compressors and the indexer's weights_proj stay unquantized, as that release ships them.

--quantize mxfp4 writes a GPT-OSS checkpoint the way OpenAI publishes gpt-oss-20b/120b: the experts'
gate_up_proj and down_proj become `<name>_blocks` (U8 [E, out, in/32, 16], two e2m1 values per byte) and
`<name>_scales` (U8 [E, out, in/32], e8m0), everything else stays as it is, and config.json gets
{"quant_method": "mxfp4", "modules_to_not_convert": [...]} as published. hidden_size and intermediate_size
must be multiples of 32. The references run on the weights as transformers' own convert_moe_packed_tensors
dequantizes them (checked equal to this script's reading of the format, which is r3's).

--family kimi_k3 (and --from-checkpoint of a kimi_k3 folder) runs the shared Kimi K3 oracle instead of a
transformers class (tools/k3_oracle.py): give --k3-oracle (reference/kimi_k3/oracle) and --k3-modular
(transformers' modular_kimi_k3.py at commit e6ffd13); the config overrides use KimiK3TextConfig's names.

Needs torch, transformers (5.17 was used for the shipped fixtures) and safetensors.
"""
import argparse
import copy
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3_oracle  # noqa: E402

# Tiny configs of the shipped fixtures (noise keys such as transformers_version, dtype, use_cache,
# initializer_range and training-only router losses removed). COMMON is merged into every family.
COMMON = {"hidden_size": 64, "vocab_size": 320, "hidden_act": "silu", "rms_norm_eps": 1e-06,
          "tie_word_embeddings": False, "num_attention_heads": 4}
ROPE = {"rope_theta": 10000.0, "rope_type": "default"}
TINY_CONFIGS = {
    "qwen3_moe": {"attention_bias": False, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
                  "decoder_sparse_step": 1, "head_dim": 16, "intermediate_size": 128, "max_position_embeddings": 256,
                  "mlp_only_layers": [], "moe_intermediate_size": 32, "norm_topk_prob": True,
                  "num_experts_per_tok": 2, "num_hidden_layers": 3, "num_key_value_heads": 2,
                  "num_local_experts": 8, "rope_parameters": ROPE, "sliding_window": None,
                  "use_sliding_window": False},
    "qwen2_moe": {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "decoder_sparse_step": 1,
                  "head_dim": 16, "intermediate_size": 128, "layer_types": ["full_attention"] * 3,
                  "max_position_embeddings": 256, "max_window_layers": 28, "mlp_only_layers": [],
                  "moe_intermediate_size": 32, "norm_topk_prob": False, "num_experts": 8,
                  "num_experts_per_tok": 2, "num_hidden_layers": 3, "num_key_value_heads": 2, "qkv_bias": True,
                  "rope_parameters": ROPE, "shared_expert_intermediate_size": 64, "sliding_window": 0,
                  "use_sliding_window": False},
    "mixtral": {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None, "head_dim": 16, "intermediate_size": 32,
                "max_position_embeddings": 256, "num_experts_per_tok": 2, "num_hidden_layers": 3,
                "num_key_value_heads": 2, "num_local_experts": 8, "rope_parameters": ROPE, "sliding_window": None},
    "olmoe": {"attention_bias": False, "bos_token_id": None, "eos_token_id": 50279, "pad_token_id": 1,
              "clip_qkv": None, "head_dim": 16, "intermediate_size": 32, "max_position_embeddings": 256,
              "norm_topk_prob": False, "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 3,
              "num_key_value_heads": 4, "rope_parameters": ROPE},
    "deepseek_v2": {"attention_bias": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None,
                    "first_k_dense_replace": 1, "head_dim": 8, "intermediate_size": 128, "kv_lora_rank": 16,
                    "max_position_embeddings": 256, "mlp_bias": False, "moe_intermediate_size": 32, "n_group": 4,
                    "n_routed_experts": 16, "n_shared_experts": 2, "norm_topk_prob": False,
                    "num_experts_per_tok": 4, "num_hidden_layers": 3, "num_key_value_heads": 4, "pretraining_tp": 1,
                    "q_lora_rank": None, "qk_head_dim": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                    "rope_parameters": ROPE, "routed_scaling_factor": 1.0, "topk_group": 2,
                    "topk_method": "group_limited_greedy", "v_head_dim": 16},
    "deepseek_v3": {"attention_bias": False, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": None,
                    "first_k_dense_replace": 1, "head_dim": 8, "intermediate_size": 128, "kv_lora_rank": 16,
                    "max_position_embeddings": 256, "moe_intermediate_size": 32, "n_group": 4,
                    "n_routed_experts": 16, "n_shared_experts": 1, "norm_topk_prob": True, "num_experts_per_tok": 4,
                    "num_hidden_layers": 3, "num_key_value_heads": 4, "num_nextn_predict_layers": 1,
                    "pretraining_tp": 1, "q_lora_rank": 32, "qk_head_dim": 24, "qk_nope_head_dim": 16,
                    "qk_rope_head_dim": 8, "rope_interleave": True, "rope_parameters": ROPE,
                    "routed_scaling_factor": 2.5, "topk_group": 2, "v_head_dim": 16},
    # The shared kimi_linear fixture's config (its KDA sizes in transformers' top-level names).
    "kimi_linear": {"attention_bias": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
                    "intermediate_size": 128, "kv_lora_rank": 16, "model_max_length": 256,
                    "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
                    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "linear_head_dim": 16,
                    "linear_num_heads": 4, "linear_conv_kernel_dim": 4, "moe_intermediate_size": 32,
                    "moe_renormalize": True, "num_expert_group": 1, "num_experts": 8, "num_experts_per_token": 2,
                    "num_hidden_layers": 4, "num_key_value_heads": 4, "num_shared_experts": 1, "q_lora_rank": None,
                    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "rope_theta": 10000.0,
                    "routed_scaling_factor": 2.446, "topk_group": 1, "v_head_dim": 16},
    "deepseek_v4": {"attention_bias": False, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": None,
                    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
                    "compress_rope_theta": 160000.0, "hc_eps": 1e-06, "hc_mult": 2, "hc_sinkhorn_iters": 20,
                    "head_dim": 32, "index_head_dim": 16, "index_n_heads": 2, "index_topk": 3,
                    "layer_types": ["sliding_attention", "compressed_sparse_attention",
                                    "heavily_compressed_attention", "compressed_sparse_attention"],
                    "max_position_embeddings": 256, "mlp_bias": False, "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
                    "moe_intermediate_size": 32, "n_routed_experts": 16, "n_shared_experts": 1, "norm_topk_prob": True,
                    "num_experts_per_tok": 4, "num_hidden_layers": 4, "num_key_value_heads": 1,
                    "num_nextn_predict_layers": 1, "o_groups": 2, "o_lora_rank": 16, "partial_rotary_factor": 0.25,
                    "q_lora_rank": 32, "qk_rope_head_dim": 8,
                    "rope_parameters": {"compress": {"partial_rotary_factor": 0.25, "rope_theta": 160000.0, "rope_type": "default"},
                                        "main": {"partial_rotary_factor": 0.25, "rope_theta": 10000.0, "rope_type": "default"}},
                    "rope_theta": 10000.0, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus",
                    "sliding_window": 8, "swiglu_limit": 10.0},
    "glm4_moe": {"attention_bias": False, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
                 "first_k_dense_replace": 1, "head_dim": 16, "intermediate_size": 128, "max_position_embeddings": 256,
                 "moe_intermediate_size": 32, "n_group": 4, "n_routed_experts": 16, "n_shared_experts": 1,
                 "norm_topk_prob": True, "num_experts_per_tok": 4, "num_hidden_layers": 3, "num_key_value_heads": 2,
                 "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5,
                 "rope_parameters": {"partial_rotary_factor": 0.5, "rope_theta": 10000.0, "rope_type": "default"},
                 "routed_scaling_factor": 1.5, "topk_group": 2, "use_qk_norm": True},
    "gpt_oss": {"attention_bias": True, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
                "head_dim": 16, "intermediate_size": 32, "layer_types": ["sliding_attention", "full_attention"],
                "max_position_embeddings": 256, "num_experts_per_tok": 2, "num_hidden_layers": 2,
                "num_key_value_heads": 2, "num_local_experts": 8,
                "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                    "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
                                    "rope_type": "yarn", "truncate": False},
                "sliding_window": 8},
    "kimi_linear": {"attention_bias": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "head_dim": 8,
                    "intermediate_size": 128, "kv_lora_rank": 16,
                    "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
                    "linear_attn_config": {"full_attn_layers": [3], "head_dim": 16, "kda_layers": [1, 2, 4],
                                           "num_heads": 4, "short_conv_kernel_size": 4},
                    "linear_conv_kernel_dim": 4, "linear_head_dim": 16, "linear_num_heads": 4,
                    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "model_max_length": 256,
                    "moe_intermediate_size": 32, "moe_renormalize": True, "num_expert_group": 1, "num_experts": 8,
                    "num_experts_per_token": 2, "num_hidden_layers": 4, "num_key_value_heads": 4,
                    "num_shared_experts": 1, "pretraining_tp": 1, "q_lora_rank": None, "qk_head_dim": 24,
                    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "rope_theta": 10000.0,
                    "routed_scaling_factor": 2.446, "topk_group": 1, "v_head_dim": 16},
}
# Tiny configs written the way the family's released checkpoints write config.json: legacy keys that
# transformers folds in when it loads the file (here: `rope_scaling`, `compress_ratios`, `num_hash_layers`,
# `qk_rope_head_dim`). The fixture's config.json is this dict itself (plus architectures/model_type), and the
# reference model is loaded from it, so the reference covers transformers' reading of such a config too.
# name -> (model_type, config)
RELEASED_STYLE = {
    # DeepSeek-V4 as released: YaRN (factor 16, beta 32/1) on the compress rope (CSA/HCA layers, their
    # compressors and indexer; the sliding layers keep plain RoPE), max_position_embeddings =
    # factor * original_max_position_embeddings (released: 16 * 65536). Scaled down so that YaRN matters
    # at tiny lengths: original 256, max 4096; with 8 rotary channels and compress_rope_theta 160000 the
    # four frequencies are kept / half-interpolated / interpolated / interpolated. Compress rates as
    # released (CSA 4, HCA 128), so a sequence of > 256 tokens gives two HCA entries (positions 0, 128).
    "deepseek_v4_yarn": ("deepseek_v4", {
        "vocab_size": 320, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 32, "qk_rope_head_dim": 8, "q_lora_rank": 32, "o_groups": 2,
        "o_lora_rank": 16, "moe_intermediate_size": 32, "n_routed_experts": 16, "n_shared_experts": 1,
        "num_experts_per_tok": 4, "num_hash_layers": 2, "scoring_func": "sqrtsoftplus", "norm_topk_prob": True,
        "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "hidden_act": "silu", "rms_norm_eps": 1e-06,
        "hc_mult": 2, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06, "sliding_window": 8,
        "compress_ratios": [0, 4, 128, 4], "index_n_heads": 2, "index_head_dim": 16, "index_topk": 3,
        "rope_theta": 10000.0, "compress_rope_theta": 160000.0, "max_position_embeddings": 4096,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 256,
                         "beta_fast": 32, "beta_slow": 1},
        "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
        "attention_bias": False}),
}
NOTE = ("reference_i: forward over input_ids[:-1] (prompt + generated minus last) in float64; "
        "topk_ids[t, j, k] = expert chosen at token t by the j-th MoE layer (moe_layers[j]).")


def die(msg):
    sys.exit(f"make_reference: error: {msg}")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--family", help="build a random tiny checkpoint of this family: "
                     + ", ".join(list(TINY_CONFIGS) + list(RELEASED_STYLE) + [k3_oracle.MODEL_TYPE]))
    src.add_argument("--from-checkpoint", metavar="DIR", help="use an existing HF folder instead of a random model")
    p.add_argument("--out", required=True, help="output folder (checkpoint + reference files)")
    p.add_argument("--seed", type=int, default=1234, help="seed for weights and prompt ids (default 1234)")
    p.add_argument("--config-override", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="override tiny-config keys (VALUE parsed as JSON if possible; dotted keys reach nested dicts)")
    p.add_argument("--prompt-lens", default="12,5", help="comma-separated prompt lengths, one sequence each")
    p.add_argument("--gen", type=int, default=8, help="greedy tokens generated per prompt (default 8)")
    p.add_argument("--input-ids-from", metavar="REFDIR",
                   help="reuse the prompts stored in REFDIR/reference.json + reference_i.safetensors "
                        "(replaces --prompt-lens; the seed recorded is REFDIR's)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu: deterministic, tiny models)")
    default_oracle = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "reference",
                                  "kimi_k3", "oracle")
    p.add_argument("--k3-oracle", default=os.path.normpath(default_oracle), metavar="DIR",
                   help="kimi_k3: the shared oracle folder (default ../shared/reference/kimi_k3/oracle)")
    p.add_argument("--k3-modular", metavar="FILE",
                   help="kimi_k3: transformers' modular_kimi_k3.py at commit e6ffd1347cc61c22b7120d1b556101c6908ba12e")
    p.add_argument("--check-rope-scaling", action="store_true",
                   help="also run the float64 forwards with the config's RoPE scaling removed (same weights) and "
                        "fail unless the logits change; the change is recorded in reference.json")
    p.add_argument("--quantize", choices=sorted(QUANTIZERS),
                   help="write the checkpoint quantized as published (see above); references use the dequantized "
                        "weights")
    p.add_argument("--block-size", default="128,128",
                   help="--quantize fp8: weight_block_size ROWS,COLS (default 128,128, as published)")
    p.add_argument("--scale-dtype", default="float32", choices=["float32", "bfloat16"],
                   help="--quantize fp8: dtype of weight_scale_inv (float32: DeepSeek, Kimi; bfloat16: Qwen3 FP8)")
    p.add_argument("--scale-fmt", default="float", choices=["float", "ue8m0"],
                   help="--quantize fp8: quantization_config.scale_fmt; ue8m0: every scale a power of two (rounded "
                        "up, as transformers' Fp8Quantize does), in a float32 container, as DeepSeek-V4-Flash ships")
    p.add_argument("--scale-name", default="weight_scale_inv", choices=["weight_scale_inv", "scale"],
                   help="--quantize fp8: the scale tensor of <module>.weight: <module>.weight_scale_inv, or "
                        "<module>.scale as DeepSeek-V4-Flash names it")
    # --quantize mxfp4 takes no options: blocks of 32 values with e8m0 scales, as published.
    a = p.parse_args(argv)
    try:
        a.block_size = [int(x) for x in a.block_size.split(",")]
    except ValueError:
        die(f"--block-size must be ROWS,COLS, got '{a.block_size}'")
    if len(a.block_size) != 2 or min(a.block_size) < 1:
        die(f"--block-size must be two positive integers, got {a.block_size}")
    known = list(TINY_CONFIGS) + list(RELEASED_STYLE) + [k3_oracle.MODEL_TYPE]
    if a.family is not None and a.family not in known:
        die(f"unknown family '{a.family}'; known families: {', '.join(known)}")
    if a.from_checkpoint and a.config_override:
        die("--config-override only applies to --family builds")
    try:
        a.prompt_lens = [int(x) for x in a.prompt_lens.split(",") if x.strip()]
    except ValueError:
        die(f"--prompt-lens must be comma-separated integers, got '{a.prompt_lens}'")
    if not a.prompt_lens or min(a.prompt_lens) < 1 or a.gen < 1:
        die("prompt lengths and --gen must be >= 1")
    return a


def apply_overrides(cfg, overrides):
    for item in overrides:
        if "=" not in item:
            die(f"--config-override expects KEY=VALUE, got '{item}'")
        key, raw = item.split("=", 1)
        try:
            val = json.loads(raw)
        except json.JSONDecodeError:
            val = raw
        node, parts = cfg, key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = val


def reinit_weights(model, torch, seed):
    """HF's default init (std 0.02) gives near-uniform routing; use O(1) activations instead.
    Approximates the weight statistics of the shipped fixtures (not their exact bits): Linear-like [out, in] ~ N(0, 1/in); fused 3-D expert
    tensors ~ N(0, 1/hidden); norm weights ~ 1 + 0.2 N; other vectors (biases, correction biases) ~ 0.2 N."""
    gen = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    persistent = set(model.state_dict().keys())
    tensors = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if n in persistent]
    with torch.no_grad():
        for name, t in tensors:
            if "tid2eid" in name:  # deepseek_v4 hash routing table: K distinct experts per token id
                rows = [torch.randperm(_n_experts(model), generator=gen)[: t.shape[-1]] for _ in range(t.shape[0])]
                t.copy_(torch.stack(rows).to(t.dtype))
                continue
            if not t.is_floating_point():
                continue
            noise = torch.randn(t.shape, generator=gen, dtype=torch.float32)
            if t.dim() == 2:
                val = noise / t.shape[-1] ** 0.5
            elif t.dim() == 3:
                val = noise / hidden ** 0.5
            elif "norm" in name.lower():
                val = 1.0 + 0.2 * noise
            else:
                val = 0.2 * noise
            t.copy_(val.to(t.dtype))


def _n_experts(model):
    c = model.config
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if isinstance(getattr(c, key, None), int):
            return getattr(c, key)
    die("cannot find the number of experts in the config")


def build_random(args, out, torch, transformers):
    released = args.family in RELEASED_STYLE
    if released:
        model_type, cfg = RELEASED_STYLE[args.family]
        cfg = copy.deepcopy(cfg)
    else:
        model_type, cfg = args.family, copy.deepcopy(dict(COMMON, **TINY_CONFIGS[args.family]))
    apply_overrides(cfg, args.config_override)
    config = transformers.AutoConfig.for_model(model_type, **copy.deepcopy(cfg))
    torch.manual_seed(args.seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float()
    reinit_weights(model, torch, args.seed)
    model.save_pretrained(out)  # writes model.safetensors (HF layout), config.json, generation_config.json
    if released:  # replace transformers' normalized config.json by the released-style one
        path = os.path.join(out, "config.json")
        saved = json.load(open(path))
        raw = {"architectures": saved["architectures"], "model_type": model_type, **cfg, "dtype": "float32",
               "transformers_version": saved.get("transformers_version")}
        with open(path, "w") as f:
            json.dump(raw, f, indent=2)


# Quantized checkpoints as published. A method has a quantizer (float32 checkpoint tensors -> the
# tensors a published checkpoint stores, its quantization_config and a one-line summary) and a
# dequantizer (stored tensors -> float32, exactly as r3 computes them); the references always run on the
# dequantized float32 weights. FP8 (DeepSeek, Kimi, Qwen3) and MXFP4 (GPT-OSS's experts).
# DeepSeek-V4-Flash ships its compressors' and the indexer's weights projection in BF16, without
# scales (transformers 5.17's DeepseekV4PreTrainedModel._keep_in_fp32_modules, in the checkpoint's names).
FP8_UNQUANTIZED_MODULES = (".attn.compressor.", ".attn.indexer.compressor.", ".attn.indexer.weights_proj.")


def quantized_as_published(name, t):
    """Projections of the decoder layers; not embeddings, lm_head, norms, biases, router gates or
    DeepSeek-V4's compressor / indexer-weights projections."""
    return (t.dim() == 2 and name.startswith("model.layers.") and name.endswith(".weight")
            and not name.endswith(".gate.weight") and not any(m in name for m in FP8_UNQUANTIZED_MODULES))


def fp8_scale_name(weight_name, scale_name):
    """Where a quantized weight's scales are stored: <name>_scale_inv, or <module>.scale."""
    return weight_name + "_scale_inv" if scale_name == "weight_scale_inv" else weight_name[: -len("weight")] + "scale"


def _block_grid(t, block, torch):
    """t [rows, cols] zero-padded to whole blocks, as [rows/R, R, cols/C, C]."""
    (R, C), (rows, cols) = block, t.shape
    padded = torch.nn.functional.pad(t, (0, -cols % C, 0, -rows % R))
    return padded.reshape(padded.shape[0] // R, R, padded.shape[1] // C, C)


def _expand(scales, block, shape):
    R, C = block
    return scales.repeat_interleave(R, 0).repeat_interleave(C, 1)[: shape[0], : shape[1]]


def quantize_fp8(tensors, args, torch):
    """Per block: scale = amax / 448 (1 for an all-zero block; zero padding of partial blocks does not change
    amax), stored in --scale-dtype; fp8 = e4m3(w / scale) with torch's rounding (clamped to +-448 first)."""
    block, sdtype = args.block_size, getattr(torch, args.scale_dtype)
    out = {}
    for name, t in tensors.items():
        if not quantized_as_published(name, t):
            out[name] = t
            continue
        amax = _block_grid(t.float(), block, torch).abs().amax(dim=(1, 3))
        scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        if args.scale_fmt == "ue8m0":
            scale = torch.pow(2.0, torch.ceil(torch.log2(scale)))
        scale = scale.to(sdtype)
        q = (t.float() / _expand(scale.float(), block, t.shape)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        out[name], out[fp8_scale_name(name, args.scale_name)] = q.contiguous(), scale.contiguous()
    config = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": list(block)}
    if args.scale_dtype == "float32":
        config["fmt"] = "e4m3"  # DeepSeek's and Kimi's configs spell the format; Qwen3's leave it out
    if args.scale_fmt != "float":
        config["scale_fmt"] = args.scale_fmt
    n = sum(1 for v in out.values() if v.dtype == torch.float8_e4m3fn)
    return out, config, f"quantized {n} weights to fp8, blocks {args.block_size}, scales {args.scale_dtype}"


def dequantize_fp8(tensors, config, torch):
    """fp8 * scale_inv per block, a float32 product rounded once (what r3's kernels multiply by)."""
    block, out = config["weight_block_size"], {}
    scales = set()
    for name, t in tensors.items():
        if t.dtype == torch.float8_e4m3fn:
            scale_name = next(n for n in (fp8_scale_name(name, "weight_scale_inv"), fp8_scale_name(name, "scale"))
                              if n in tensors)
            scales.add(scale_name)
            t = t.float() * _expand(tensors[scale_name].float(), block, t.shape)
        out[name] = t
    for name in scales:
        del out[name]
    return out


# MXFP4, as OpenAI publishes GPT-OSS (checked against transformers' integrations/mxfp4.py, which holds
# the format's definition for transformers: Mxfp4GptOssExperts for the shapes, convert_moe_packed_tensors
# for the values and the layout):
# - only the experts' fused projections are quantized; a stack stored unquantized as [E, in, out]
#   (gate_up_proj [E, hidden, 2 * intermediate], gate and up interleaved along the last axis; down_proj
#   [E, intermediate, hidden]) is stored as `_blocks` U8 [E, out, in / 32, 16] and `_scales` U8
#   [E, out, in / 32]: output-major, convert_moe_packed_tensors transposes back after dequantizing;
# - value 2i of a 32-value block is the low nibble of byte i, value 2i + 1 the high nibble (lut[blk & 0x0F]
#   into the even positions, lut[blk >> 4] into the odd ones);
# - a nibble is e2m1, FP4_VALUES below; the value is lut[nibble] * 2^(scale - 127) (torch.ldexp with
#   scales - 127), exact in float32 for every scale but 255, which is e8m0's NaN (r3 refuses it);
# - the published config: {"quant_method": "mxfp4", "modules_to_not_convert": MXFP4_NOT_CONVERTED}.
MXFP4_BLOCK = 32
MXFP4_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _mxfp4_stack(name):
    return name.endswith(".mlp.experts.gate_up_proj") or name.endswith(".mlp.experts.down_proj")


def quantize_mxfp4(tensors, args, torch):
    """Per 32 values along `in`: the e8m0 scale is the smallest power of two 2^e with amax <= 6 * 2^e (what
    triton's downcast_to_mxfp, OpenAI's quantizer, does by default: the scale rounded up), stored e + 127
    (e = 0 for an all-zero block); each value / 2^e is rounded to the nearest e2m1, ties to the even code,
    keeping its sign (also when it rounds to zero). Everything else is stored as it was."""
    out, stacks = {}, 0
    grid_edges = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64)
    tie_up = torch.tensor([False, True, False, True, False, True, False])  # an edge between codes i, i+1: even wins
    for name, t in tensors.items():
        if not _mxfp4_stack(name):
            out[name] = t
            continue
        if t.dim() != 3 or t.shape[1] % MXFP4_BLOCK:
            die(f"--quantize mxfp4: {name} {list(t.shape)} is not [experts, in, out] with `in` a multiple of 32 "
                "(hidden_size and intermediate_size must be multiples of 32: use --config-override)")
        experts, fan_in, fan_out = t.shape
        w = t.double().transpose(1, 2).reshape(experts, fan_out, fan_in // MXFP4_BLOCK, MXFP4_BLOCK)  # exact
        amax = w.abs().amax(-1)
        mant, p = torch.frexp(amax)  # amax = mant * 2^p, mant in [0.5, 1); 6 * 2^e = 0.75 * 2^(e + 3)
        e = torch.where(amax > 0, torch.where(mant <= 0.75, p - 3, p - 2), torch.zeros_like(p)).long()
        if int(e.min()) < -127 or int(e.max()) > 127:
            die(f"--quantize mxfp4: {name} needs a scale outside e8m0's 2^-127 .. 2^127")
        inverse = ((1023 - e) << 52).view(torch.float64)  # 2^-e from its bits: w * 2^-e is exact
        a = (w * inverse[..., None]).abs()  # <= 6 by the choice of e
        code = (a[..., None] > grid_edges).sum(-1) + ((a[..., None] == grid_edges) & tie_up).sum(-1)
        code = code | torch.where(torch.signbit(w), 8, 0)
        packed = (code[..., 0::2] | (code[..., 1::2] << 4)).to(torch.uint8)
        out[name + "_blocks"] = packed.contiguous()
        out[name + "_scales"] = (e + 127).to(torch.uint8).contiguous()
        stacks += 1
    if stacks == 0:
        die("--quantize mxfp4: the checkpoint has no GPT-OSS experts (mlp.experts.gate_up_proj / down_proj)")
    config = {"quant_method": "mxfp4", "modules_to_not_convert": list(MXFP4_NOT_CONVERTED)}
    return out, config, f"quantized {stacks} expert stacks to mxfp4 (blocks of 32 values, e8m0 scales)"


def _mxfp4_values(blocks, scales, torch):
    """This script's (and r3's) reading of MXFP4: [E, out, G, 16] blocks and [E, out, G] scales to the
    float32 stack [E, G * 32, out]: lut[nibble] * 2^(scale - 127), computed exactly in float64 (2^(s - 127)
    built from its bits), rounded once to float32 (where it overflows: inf, as in float32 torch.ldexp)."""
    if bool((scales == 255).any()):
        die("MXFP4 scales hold 255, e8m0's NaN")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float64)
    values = torch.stack([lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]], dim=-1)  # [..., 16, 2]
    experts, fan_out, groups = scales.shape
    values = values.reshape(experts, fan_out, groups, MXFP4_BLOCK)
    scale = ((scales.long() + (1023 - 127)) << 52).view(torch.float64)  # 2^(s - 127) as float64 bits
    values = (values * scale[..., None]).reshape(experts, fan_out, groups * MXFP4_BLOCK)
    return values.transpose(1, 2).float().contiguous()


def dequantize_mxfp4(tensors, config, torch):
    """Each `_blocks`/`_scales` pair back to the unquantized stack [E, in, out] in float32, by transformers'
    own convert_moe_packed_tensors (the definition of the layout, nibble order and values), which must give
    exactly _mxfp4_values (what r3 computes with)."""
    try:
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    except ImportError as e:
        die(f"--quantize mxfp4 needs transformers' integrations.mxfp4.convert_moe_packed_tensors ({e})")
    out = {}
    for name, t in tensors.items():
        if name.endswith("_scales") and name[: -len("_scales")] + "_blocks" in tensors:
            continue
        if not name.endswith("_blocks"):
            out[name] = t
            continue
        stack = name[: -len("_blocks")]
        scales = tensors[stack + "_scales"]
        ours = _mxfp4_values(t, scales, torch)
        theirs = convert_moe_packed_tensors(t.clone(), scales.clone(), dtype=torch.float32).float().cpu()
        if theirs.shape != ours.shape or not torch.equal(theirs, ours):
            die(f"{stack}: transformers' convert_moe_packed_tensors {list(theirs.shape)} differs from this script's "
                f"MXFP4 reading {list(ours.shape)}: the format assumptions here (and r3's) need checking")
        out[stack] = theirs.contiguous()
    return out


QUANTIZERS = {"fp8": quantize_fp8, "mxfp4": quantize_mxfp4}
DEQUANTIZERS = {"fp8": dequantize_fp8, "mxfp4": dequantize_mxfp4}
QUANTIZED_NOTES = {
    "fp8": "the references ran transformers on the dequantized float32 weights (fp8 * scale_inv, one rounding)",
    "mxfp4": "the references ran transformers on the experts as its convert_moe_packed_tensors dequantizes them "
             "(e2m1 * 2^(scale - 127), exact in float32)",
}


def quantize_checkpoint(out, args, torch):
    """Rewrites out/model.safetensors and out/config.json in the published quantized format."""
    from safetensors.torch import load_file, save_file
    cfg_path = os.path.join(out, "config.json")
    if "quantization_config" in json.load(open(cfg_path)):
        die(f"--quantize: {out} is quantized already")
    path = os.path.join(out, "model.safetensors")
    stored, qconfig, summary = QUANTIZERS[args.quantize](load_file(path), args, torch)
    save_file(stored, path, metadata={"format": "pt"})
    cfg = json.load(open(cfg_path))
    cfg["quantization_config"] = qconfig
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    print(summary)


def dequantized_copy(out, tmp, torch):
    """A float32 copy of the quantized checkpoint in `out`, without quantization_config, in tmp; None when
    `out` is not quantized."""
    from safetensors.torch import load_file, save_file
    cfg = json.load(open(os.path.join(out, "config.json")))
    qconfig = cfg.pop("quantization_config", None)
    if qconfig is None:
        return None
    method = qconfig.get("quant_method")
    if method not in DEQUANTIZERS:
        die(f"{out}: quantization_config.quant_method {method!r} has no dequantizer here")
    save_file(DEQUANTIZERS[method](load_file(os.path.join(out, "model.safetensors")), qconfig, torch),
              os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if os.path.exists(os.path.join(out, "generation_config.json")):
        shutil.copy2(os.path.join(out, "generation_config.json"), tmp)
    return qconfig


def load_eager(path, torch, transformers, device):
    """float32 model with eager attention AND eager experts. transformers 5 dispatches fused experts through
    `config._experts_implementation` (@use_experts_implementation; default may be grouped_mm/batched_mm)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    for m in model.modules():
        c = getattr(m, "config", None)
        if c is not None and getattr(c, "_experts_implementation", "eager") not in (None, "eager"):
            die(f"{type(m).__name__} still uses experts implementation {c._experts_implementation!r}")
        if c is not None and getattr(c, "_attn_implementation", "eager") not in (None, "eager"):
            die(f"{type(m).__name__} still uses attention implementation {c._attn_implementation!r}")
    return model.to(device).eval()


def find_moe_blocks(model, torch):
    """(layer index, gate module, experts module) for each decoder layer holding a routed MoE block, i.e. a
    module with an `experts` child and a `gate`/`router` child."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        die(f"{type(model).__name__}: cannot find the decoder layers (model.model.layers)")
    blocks = []
    for i, layer in enumerate(layers):
        found = []
        for _, m in layer.named_modules():
            experts = getattr(m, "experts", None)
            gate = next((getattr(m, a) for a in ("gate", "router") if isinstance(getattr(m, a, None), torch.nn.Module)), None)
            if isinstance(experts, torch.nn.Module) and gate is not None:
                found.append((i, gate, experts))
        if len(found) > 1:
            die(f"layer {i}: more than one MoE block found")
        blocks += found
    if not blocks:
        die(f"{type(model).__name__}: no MoE layer found")
    return blocks


def forward_f64(model, ids, torch):
    """One float64 forward over ids (1-D) recording logits, hidden states, router logits and the routing
    the experts modules received."""
    blocks = find_moe_blocks(model, torch)
    n = len(blocks)
    router, topk_ids, topk_w = [None] * n, [None] * n, [None] * n
    active = [None]
    orig_linear = torch.nn.functional.linear

    # "router_logits" = the gate's raw linear output. Some transformers 5 routers return softmax probabilities
    # under that name, so we record the first F.linear computed inside the gate's forward instead.
    def linear_spy(*a, **k):
        y = orig_linear(*a, **k)
        if active[0] is not None and router[active[0]] is None:
            router[active[0]] = y.detach()
        return y

    def gate_pre(j):
        def hook(mod, args):
            active[0] = j
        return hook

    def gate_post(j):
        def hook(mod, args, out):
            active[0] = None
            if router[j] is None:  # gate without F.linear: fall back to its (first) output
                router[j] = (out[0] if isinstance(out, (tuple, list)) else out).detach()
        return hook

    # topk ids/weights exactly as the fused experts module received them: forward(hidden, top_k_index, top_k_weights)
    def experts_pre(j):
        def hook(mod, args, kwargs):
            if topk_ids[j] is not None:
                die(f"experts module of MoE layer {blocks[j][0]} called twice in one forward")
            idx = kwargs.get("top_k_index", args[1] if len(args) > 1 else None)
            w = kwargs.get("top_k_weights", args[2] if len(args) > 2 else None)
            if idx is None or w is None:
                die(f"{type(mod).__name__} was not called as experts(hidden, top_k_index, top_k_weights)")
            idx = idx.reshape(-1, idx.shape[-1])
            w = w.reshape(idx.shape[0], -1)
            if w.shape[-1] != idx.shape[-1]:  # dense [tokens, experts] weights (gpt_oss/deepseek_v2 style)
                w = w.gather(1, idx.long())
            topk_ids[j], topk_w[j] = idx.detach(), w.detach()
        return hook

    handles = []
    for j, (_, gate, experts) in enumerate(blocks):
        handles += [gate.register_forward_pre_hook(gate_pre(j)), gate.register_forward_hook(gate_post(j)),
                    experts.register_forward_pre_hook(experts_pre(j), with_kwargs=True)]
    torch.nn.functional.linear = linear_spy
    try:
        with torch.no_grad():
            out = model(input_ids=ids[None].to(model.device), output_hidden_states=True, use_cache=False)
    finally:
        torch.nn.functional.linear = orig_linear
        for h in handles:
            h.remove()
    if any(x is None for x in topk_ids + router):
        die("a MoE layer did not record its routing (experts/gate hooks did not fire)")
    T, H = ids.shape[0], model.config.hidden_size
    res = {
        "input_ids": None,  # filled by caller
        "logits": out.logits[0].double().cpu(),
        "router_logits": torch.stack([r.reshape(T, -1) for r in router], 1).double().cpu(),
        "topk_ids": torch.stack(topk_ids, 1).to(torch.int32).cpu(),
        "topk_weights": torch.stack(topk_w, 1).double().cpu(),
    }
    hs = out.hidden_states
    # hidden_states only where the residual is one [T, H] stream (not e.g. deepseek_v4's hyper-connections)
    if hs is not None and all(h.dim() == 3 and tuple(h.shape[1:]) == (T, H) for h in hs):
        res["hidden_states"] = torch.stack([h[0] for h in hs]).double().cpu()
    return res, [b[0] for b in blocks]


def load_prompts(refdir, torch):
    from safetensors.torch import load_file
    meta = json.load(open(os.path.join(refdir, "reference.json")))
    prompts = []
    for i, s in enumerate(meta["sequences"]):
        ids = load_file(os.path.join(refdir, f"reference_{i}.safetensors"))["input_ids"]
        prompts.append(ids[: s["prompt_len"]].long())
    return prompts, meta.get("seed")


def random_prompts(lens, vocab, special, seed, torch):
    allowed = torch.tensor([t for t in range(vocab) if t not in special])  # keep bos/eos/pad ids out of prompts
    g = torch.Generator().manual_seed(seed)
    return [allowed[torch.randint(len(allowed), (n,), generator=g)] for n in lens]


def without_rope_scaling(cfg):
    """config.json dict with RoPE scaling removed: no `rope_scaling`, and every `rope_parameters` entry
    (flat, or nested per layer/rope type) reduced to plain RoPE with its theta and partial factor."""
    cfg = copy.deepcopy(cfg)
    cfg.pop("rope_scaling", None)
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        nested = [k for k, v in rp.items() if isinstance(v, dict)]
        for d in ([rp[k] for k in nested] if nested else [rp]):
            for k in list(d):
                if k not in ("rope_theta", "partial_rotary_factor"):
                    del d[k]
            d["rope_type"] = "default"
    return cfg


def check_rope_scaling(out, refs, torch, transformers, device):
    """Float64 forwards over the same inputs with the RoPE scaling removed; returns per sequence the
    relative logits change max|scaled - plain| / max|scaled| and the number of routing rows that change."""
    import tempfile
    cfg = json.load(open(os.path.join(out, "config.json")))
    plain = without_rope_scaling(cfg)
    if plain == cfg:
        die("--check-rope-scaling: the config has no RoPE scaling")
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(plain, f)
        for name in ("model.safetensors", "generation_config.json"):
            if os.path.exists(os.path.join(out, name)):
                os.symlink(os.path.join(out, name), os.path.join(tmp, name))
        model = load_eager(tmp, torch, transformers, device).double()
        checks = []
        for ids, res in refs:
            other, _ = forward_f64(model, ids, torch)
            rel = float((res["logits"] - other["logits"]).abs().max() / res["logits"].abs().max())
            rows = int((res["topk_ids"].sort(-1).values != other["topk_ids"].sort(-1).values)
                       .flatten(1).any(-1).sum())
            argmax = int((res["logits"].argmax(-1) != other["logits"].argmax(-1)).sum())
            checks.append({"logits_rel_change": rel, "routing_rows_changed": rows, "argmax_changed": argmax})
    return checks


def rope_summary(model):
    """inv_freq buffers and attention scaling of the model's rotary embeddings, for the log."""
    lines = []
    for name, mod in model.named_modules():
        for b, t in mod.named_buffers(recurse=False):
            if b.endswith("inv_freq") and "original" not in b:
                prefix = b[: -len("inv_freq")]
                scale = getattr(mod, prefix + "attention_scaling", getattr(mod, "attention_scaling", None))
                lines.append(f"{name}.{b}: {[float(x) for x in t.float().cpu()]} attention_scaling {scale}")
        if lines:
            break  # the first rotary module is enough (every copy is computed from the same config)
    return lines


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
        import transformers
        from safetensors.torch import save_file
    except ImportError as e:
        die(f"needs torch, transformers and safetensors ({e})")
    torch.set_float32_matmul_precision("highest")  # no TF32 in the float32 generate
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    k3 = args.family == k3_oracle.MODEL_TYPE or (args.from_checkpoint and k3_oracle.is_k3_folder(args.from_checkpoint))
    k3_model = k3_oracle.install(args.k3_oracle, args.k3_modular) if k3 else None
    if k3:
        k3_oracle.set_compute_dtype(k3_model, torch.float32)  # the float32 generate: float32 everywhere
    if args.family == k3_oracle.MODEL_TYPE:
        cfg = copy.deepcopy(k3_oracle.TINY)
        apply_overrides(cfg, args.config_override)
        k3_oracle.build(k3_model, cfg, out, torch, reinit_weights, args.seed)
    elif args.family:
        build_random(args, out, torch, transformers)
    else:
        src = os.path.abspath(args.from_checkpoint)
        if not os.path.isfile(os.path.join(src, "config.json")):
            die(f"{src} has no config.json")
        if src != out:  # make --out a self-contained fixture folder
            for f in ("config.json", "generation_config.json", "model.safetensors"):
                if os.path.exists(os.path.join(src, f)):
                    shutil.copy2(os.path.join(src, f), out)

    if args.quantize:
        if k3:
            die("--quantize: not for the Kimi K3 oracle")
        quantize_checkpoint(out, args, torch)
    tmp = tempfile.mkdtemp(prefix="make_reference_")
    qconfig = None if k3 else dequantized_copy(out, tmp, torch)
    weights = tmp if qconfig else out  # transformers runs the dequantized float32 weights
    model = k3_oracle.load_eager(k3_model, out, torch, args.device) if k3 else load_eager(weights, torch, transformers,
                                                                                          args.device)
    cfg, seed = model.config, args.seed
    if args.input_ids_from:
        prompts, ref_seed = load_prompts(args.input_ids_from, torch)
        seed = ref_seed if ref_seed is not None else seed
    else:
        gc = model.generation_config
        special = {t for c in (cfg, gc) for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                   for t in (getattr(c, k, None),) if isinstance(t, int)}
        prompts = random_prompts(args.prompt_lens, cfg.vocab_size, special, args.seed + 1, torch)

    # 1) float32 greedy generation; eos disabled so that exactly --gen tokens come out (also on the model's own
    #    generation_config: generate() fills unset/default fields of a passed config from it)
    model.generation_config.eos_token_id = None
    gen_cfg = transformers.GenerationConfig(do_sample=False, max_new_tokens=args.gen, min_new_tokens=0,
                                            eos_token_id=None, pad_token_id=0, num_beams=1)
    seqs = []
    for p in prompts:
        with torch.no_grad():
            x = p[None].to(args.device)
            y = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gen_cfg)
        seqs.append(y[0].cpu())
        if y.shape[1] != p.shape[0] + args.gen:
            die(f"generate returned {y.shape[1] - p.shape[0]} tokens instead of {args.gen}")

    # 2) one float64 forward per sequence over input_ids[:-1]
    if k3:
        k3_oracle.set_compute_dtype(k3_model, torch.float64)  # Kimi K3's own code in float64 too
    model = model.double()
    layer, gate, experts = find_moe_blocks(model, torch)[0]
    print(f"{type(model).__name__}: gate {type(gate).__name__}, experts {type(experts).__name__} "
          f"(experts implementation {getattr(model.config, '_experts_implementation', None)!r})")
    for line in rope_summary(model):
        print(line)
    sequences, refs = [], []
    for i, (p, ids) in enumerate(zip(prompts, seqs)):
        res, moe_layers = forward_f64(model, ids[:-1], torch)
        refs.append((ids[:-1], res))
        res["input_ids"] = ids.long()
        P = p.shape[0]
        generated = ids[P:].tolist()
        agrees = res["logits"][P - 1:].argmax(-1).tolist() == generated
        save_file({k: v.contiguous() for k, v in res.items()}, os.path.join(out, f"reference_{i}.safetensors"))
        sequences.append({"prompt_len": P, "generated": generated, "moe_layers": moe_layers,
                          "routing_source": "experts_in", "keys": sorted(res),
                          "f64_greedy_agrees_with_f32_generate": agrees})
        print(f"reference_{i}: prompt {P} + {len(generated)} tokens, moe_layers {moe_layers}, "
              f"keys {sorted(res)}, f64 greedy agrees: {agrees}")
    meta = {"model_type": cfg.model_type, "hf_class": type(model).__name__,
            "transformers": transformers.__version__, "torch": torch.__version__, "seed": seed,
            "num_experts": int(res["router_logits"].shape[-1]),
            "top_k": int(res["topk_ids"].shape[-1]), "sequences": sequences, "note": NOTE}
    if k3:
        meta["layer_types"], meta["mlp_layer_types"] = list(cfg.layer_types), list(cfg.mlp_layer_types)
        meta["source"] = {"model_code": "reference/kimi_k3/oracle (configuration, model, cache, hub names) on "
                                        "transformers' modular_kimi_k3.py @ e6ffd13, patched as tools/k3_oracle.py",
                          "float64": "Kimi K3's own code in float64 (the modular's float32 upcasts lifted)"}
    if qconfig:
        meta["quantization_config"] = qconfig
        meta["quantized_note"] = ("the checkpoint stores quantized weights as published; "
                                  + QUANTIZED_NOTES[qconfig["quant_method"]])
    if args.check_rope_scaling:
        checks = check_rope_scaling(weights, refs, torch, transformers, args.device)
        for i, c in enumerate(checks):
            print(f"reference_{i} without RoPE scaling: {c}")
        if max(c["logits_rel_change"] for c in checks) < 1e-3:
            die("removing the RoPE scaling changes the logits by less than 1e-3 (relative): the fixture would "
                "not show whether scaling is implemented")
        meta["without_rope_scaling"] = checks
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(meta, f, indent=1)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
