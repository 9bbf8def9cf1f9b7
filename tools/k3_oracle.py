"""Kimi K3 for tools/make_reference.py: transformers 5.17 has no kimi_k3, so the reference model is the
shared oracle (reference/kimi_k3/oracle: configuration, model classes, cache, checkpoint-name mapping, torch
helpers) on top of transformers' public work-in-progress modular file (modular_kimi_k3.py, transformers commit
e6ffd1347cc61c22b7120d1b556101c6908ba12e), patched as the shared fixture's reference.json `source.patches` lists.

The oracle folder is taken as an argument rather than copied here: it is the shared reference's own code, and one
copy of it is the one to trust. The modular file is public upstream code: pass its path (--k3-modular), or run
where a `transformers.models.kimi_k3` with the oracle's modeling_kimi_k3 is already importable.

Checkpoints are written and read in the names public K3 ports load (the oracle's to_hub_state_dict /
from_hub_state_dict), not in the modular's module names.
"""
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile

MODEL_TYPE = "kimi_k3"
PACKAGE = "transformers.models.kimi_k3"
ORACLE_FILES = ("configuration_kimi_k3.py", "modeling_kimi_k3.py", "_k3_ops.py")

# The shared fixture's config (hidden 64, 4 layers KDA/MLA/KDA/MLA, layer 0 dense, 16 experts top-4, latent 32,
# blocks of 2), in KimiK3TextConfig's (transformers) names; the saved config.json also carries the checkpoint's.
TINY = {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 16,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "linear_attn_key_heads": 4,
        "linear_attn_key_head_dim": 16, "linear_attn_value_heads": 4, "linear_attn_value_head_dim": 16,
        "linear_conv_kernel_dim": 4, "forget_gate_lower_bound": -5.0, "use_full_rank_output_gate": True,
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "first_k_dense_replace": 1,
        "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
        "norm_topk_prob": True, "routed_scaling_factor": 1.5, "moe_intermediate_size": 32,
        "routed_expert_hidden_size": 32, "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
        "attn_res_block_size": 2, "rms_norm_eps": 1e-05, "max_position_embeddings": 256, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}

# (old, new, how many times old must occur): the modular as the reference runs it.
PATCHES = [
    # tolerate a transformers without the helper; the reference = the torch fallbacks (fla has no float64)
    ("from ...utils.import_utils import is_flash_linear_attention_available\n",
     "def is_flash_linear_attention_available():  # r3: the torch fallbacks are the reference\n    return False\n", 1),
    # k3_dtype import; pure-torch causal conv1d only where transformers has none
    ("from ..qwen3_next.modular_qwen3_next import causal_conv1d_fn, causal_conv1d_update\n",
     "try:\n    from ..qwen3_next.modular_qwen3_next import causal_conv1d_fn, causal_conv1d_update\n"
     "except ImportError:\n    causal_conv1d_fn = causal_conv1d_update = None\n"
     "from ._k3_ops import RMSNormGatedWithActivation, k3_dtype\n"
     "from . import _k3_ops\n"
     "causal_conv1d_fn = causal_conv1d_fn or _k3_ops.causal_conv1d_fn\n"
     "causal_conv1d_update = causal_conv1d_update or _k3_ops.causal_conv1d_update\n", 1),
    # KDA o_norm is built with activation='sigmoid'; Qwen3NextRMSNormGated ignores it (SiLU)
    ("class KimiK3RMSNormGated(Qwen3NextRMSNormGated):", "class KimiK3RMSNormGated(RMSNormGatedWithActivation):", 1),
    # KDA kernels and SiTU: float32 upcast -> switchable compute dtype
    (".to(torch.float32)", ".to(k3_dtype())", 4),
    # KDA gate/beta and the block residual: float32 upcast -> switchable dtype
    (".float()", ".to(k3_dtype())", 4),
]
TRUNCATE_AT = "class KimiK3PreTrainedModel(Kimi_K25PreTrainedModel):"  # undefined base; the oracle has its own


def die(msg):
    sys.exit(f"make_reference: error: {msg}")


def patched_modular(source):
    for old, new, count in PATCHES:
        found = source.count(old)
        if found != count:
            die(f"modular_kimi_k3.py: expected {count} occurrence(s) of {old.strip()!r}, found {found} "
                "(not the e6ffd13 version?)")
        source = source.replace(old, new)
    cut = source.find(TRUNCATE_AT)
    if cut < 0:
        die(f"modular_kimi_k3.py: no {TRUNCATE_AT!r}")
    return source[:cut]


def install(oracle_dir, modular_path):
    """Makes transformers.models.kimi_k3.modeling_kimi_k3 (the oracle) importable; returns it."""
    try:
        mod = importlib.import_module(PACKAGE + ".modeling_kimi_k3")
        if hasattr(mod, "to_hub_state_dict") and not modular_path:
            return mod  # already installed (e.g. by the shared fixture's generator)
    except Exception:  # noqa: BLE001 (transformers' lazy module may raise more than ImportError)
        pass
    if not oracle_dir or not all(os.path.isfile(os.path.join(oracle_dir, f)) for f in ORACLE_FILES):
        die(f"--k3-oracle must be the folder with {', '.join(ORACLE_FILES)} (reference/kimi_k3/oracle)")
    if not modular_path or not os.path.isfile(modular_path):
        die("--k3-modular must name transformers' modular_kimi_k3.py at commit e6ffd1347cc61c22b7120d1b556101c6908ba12e")
    import transformers.models
    pkg_dir = tempfile.mkdtemp(prefix="r3_kimi_k3_")
    for f in ORACLE_FILES:
        shutil.copy2(os.path.join(oracle_dir, f), pkg_dir)
    with open(modular_path) as f:
        source = patched_modular(f.read())
    with open(os.path.join(pkg_dir, "modular_kimi_k3.py"), "w") as f:
        f.write(source)
    with open(os.path.join(pkg_dir, "__init__.py"), "w") as f:
        f.write("")
    spec = importlib.util.spec_from_file_location(PACKAGE, os.path.join(pkg_dir, "__init__.py"),
                                                  submodule_search_locations=[pkg_dir])
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    spec.loader.exec_module(package)
    transformers.models.kimi_k3 = package
    return importlib.import_module(PACKAGE + ".modeling_kimi_k3")


def set_compute_dtype(m, torch_dtype):
    """The dtype of the modular's lifted float32 upcasts: float32 for the float32 generate, float64 for the
    reference forward (Kimi K3's own code in float64, as the shared fixture)."""
    importlib.import_module(PACKAGE + "._k3_ops").set_k3_dtype(torch_dtype)


def build(m, cfg, out, torch, reinit_weights, seed):
    """A random tiny checkpoint from cfg (KimiK3TextConfig kwargs) written to out in the hub names."""
    from safetensors.torch import load_file, save_file
    config_mod = importlib.import_module(PACKAGE + ".configuration_kimi_k3")
    config = config_mod.KimiK3TextConfig(**cfg)
    config.architectures = ["KimiK3ForCausalLM"]
    torch.manual_seed(seed)
    model = m.KimiK3ForCausalLM(config).float()
    reinit_weights(model, torch, seed)
    # cloned: the per-expert w1/w3 are slices of one stacked parameter, and safetensors refuses shared storage
    hub = {k: v.clone() for k, v in m.to_hub_state_dict(model.state_dict(), config).items()}
    path = os.path.join(out, "model.safetensors")
    save_file(hub, path, metadata={"format": "pt"})
    config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    back = m.from_hub_state_dict(load_file(path), config)  # the mapping must round-trip bit for bit
    own = model.state_dict()
    if set(back) != set(own) or any(not torch.equal(back[k], own[k]) for k in own):
        die("the checkpoint does not read back into the model bit for bit")


def load_eager(m, path, torch, device):
    """float32 model from a hub-named checkpoint: eager attention, eager experts (the oracle's self-tested
    choice of experts forward)."""
    from safetensors.torch import load_file
    config_mod = importlib.import_module(PACKAGE + ".configuration_kimi_k3")
    config = config_mod.KimiK3TextConfig.from_pretrained(path)
    config._attn_implementation = "eager"
    print("experts forward:", m.select_experts_forward())
    model = m.KimiK3ForCausalLM(config).float()
    model.load_state_dict(m.from_hub_state_dict(load_file(os.path.join(path, "model.safetensors")), config),
                          strict=True)
    if os.path.isfile(os.path.join(path, "generation_config.json")):
        from transformers import GenerationConfig
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model.to(device).eval()


def is_k3_folder(path):
    import json
    cfg = os.path.join(path, "config.json")
    return os.path.isfile(cfg) and json.load(open(cfg)).get("model_type") == MODEL_TYPE
