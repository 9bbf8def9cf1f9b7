#!/usr/bin/env python3
"""Writes the malformed-input suite: one folder per case under tests/malformed/.

Each case is the smallest set of files that reproduces one class of bad input found by fuzzing
r3's loader and CLI (nesting, size arithmetic, signed overflow, hangs, runaway allocation, inputs
accepted that must be refused, multi-line messages, NaN-making configs and weights), plus
`case.json`, which tells tests/test_malformed_inputs.cpp how to run it:

  args    the r3 command line; "{case}" is the case's folder (copied to a temporary folder with
          its setup applied), "{data}" is tests/data
  setup   steps the runner applies to the copy first, for what git cannot hold or should not
          hold twice (parent folders are created as needed):
          {"copy": "<family>/<file>", "to": path} copies a fixture file,
          {"fifo": path}, {"symlink": target, "at": path}, {"mkdir": path},
          {"sparse": path, "bytes": n} (extends a file with a hole)
  exit    the expected exit status (1: a refusal)
  stderr  the exact expected standard error: one line `r3: error: ...`

Run it from the repository root after changing a case; tests check that the committed folder is
exactly what this script writes:

  python3 tools/make_malformed_inputs.py [--out tests/malformed]
"""

import argparse
import json
import shutil
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
INT64_MAX = "9223372036854775807"


def le64(n):
    return struct.pack("<Q", n)


def safetensors_bytes(header_text, data=b"", header_len=None):
    """A safetensors file with a raw header text (so malformed headers can be written)."""
    raw = header_text.encode()
    return le64(len(raw) if header_len is None else header_len) + raw + data


def safetensors_tensors(tensors):
    """A well-formed safetensors file from [(name, dtype, shape, packed bytes)]."""
    header, data = {}, b""
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    return safetensors_bytes(json.dumps(header, separators=(",", ":")), data)


def fixture_header(family):
    raw = (DATA / family / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    return header


def fixture_config(family):
    return json.loads((DATA / family / "config.json").read_text())


def generate(model="{case}/model", ids="17,42,7", extra=("--max-new-tokens", "2")):
    return ["generate", "-q", "--model", model, "--ids", ids, *extra]


def forward(model="{data}/qwen3_moe", ids="1,2,3", extra=()):
    return ["forward", "-q", "--model", model, "--ids", ids, *extra]


def err(message):
    return "r3: error: " + message + "\n"


class Suite:
    def __init__(self, out):
        self.out = out
        self.cases = []

    def case(self, name, about, args, stderr, files=None, setup=(), exit_code=1):
        d = self.out / name
        d.mkdir(parents=True)
        for rel, content in (files or {}).items():
            p = d / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(content if isinstance(content, bytes) else content.encode())
        spec = {"about": about, "setup": list(setup), "args": args, "exit": exit_code, "stderr": stderr}
        (d / "case.json").write_text(json.dumps(spec, indent=1) + "\n")
        self.cases.append((name, about))

    def model_with_config(self, name, about, family, stderr, edit=None, text=None, args=None):
        """A copy of fixture `family` whose config.json is edited (dict of keys to set) or replaced."""
        if text is None:
            config = fixture_config(family)
            config.update(edit)
            text = json.dumps(config, indent=1)
        self.case(name, about, args or generate(), stderr, files={"model/config.json": text},
                  setup=[{"copy": family + "/model.safetensors", "to": "model/model.safetensors"}])

    def model_with_patched_tensors(self, name, about, family, tensors, stderr, args=None, config_edit=None,
                                   drop=()):
        """Fixture `family` with some tensors replaced (or added): an index maps them to
        patch.safetensors and every other tensor but those in `drop` to the fixture's own
        model.safetensors; config.json is the fixture's, with the keys of `config_edit` set."""
        weight_map = {t: "model.safetensors" for t in fixture_header(family) if t not in drop}
        config_text = (DATA / family / "config.json").read_text()
        if config_edit:
            config = fixture_config(family)
            config.update(config_edit)
            config_text = json.dumps(config, indent=1)
        files = {"model/config.json": config_text}
        if isinstance(tensors, tuple):  # (raw, possibly malformed shard bytes, names it holds)
            shard, patched = tensors
        else:
            shard, patched = safetensors_tensors(tensors), [t[0] for t in tensors]
        for t in patched:
            weight_map[t] = "patch.safetensors"
        files["model/patch.safetensors"] = shard
        files["model/model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}, indent=1)
        self.case(name, about, args or generate(), stderr, files=files,
                  setup=[{"copy": family + "/model.safetensors", "to": "model/model.safetensors"}])


def nesting(s):
    deep = lambda levels: "[" * levels  # never closed: refused before the parser would notice
    for field, levels in [("hidden_size", 500_000), ("mlp_only_layers", 100_000), ("eos_token_id", 100_000),
                          ("rope_parameters", 100_000)]:
        config = fixture_config("qwen3_moe")
        config.pop(field)
        text = json.dumps(config)[:-1] + ', "' + field + '": ' + deep(levels) + "1" + "]" * levels + "}"
        s.model_with_config(f"nesting-config-{field.replace('_', '-')}",
                            f"config.json with '{field}' nested {levels} levels deep overflowed the stack",
                            "qwen3_moe", err("{case}/model/config.json: JSON nested deeper than 64 levels"),
                            text=text)
    s.case("nesting-replay-json", "a --replay JSON file nested 100k levels deep",
           forward(extra=("--replay", "{case}/replay.json")),
           err("{case}/replay.json: JSON nested deeper than 64 levels"),
           files={"replay.json": '{"routed_experts": ' + deep(100_000)})
    s.case("nesting-eplb-load", "an eplb-plan --load file nested 100k levels deep",
           ["eplb-plan", "--load", "{case}/load.json", "--gpus", "1"],
           err("{case}/load.json: JSON nested deeper than 64 levels"),
           files={"load.json": '{"load": [[1, ' + deep(100_000)})
    s.case("nesting-checkpoint-index", "a checkpoint index nested 100k levels deep",
           forward(model="{case}/model"),
           err("{case}/model/model.safetensors.index.json: JSON nested deeper than 64 levels"),
           files={"model/config.json": (DATA / "qwen3_moe" / "config.json").read_text(),
                  "model/model.safetensors.index.json": '{"weight_map": ' + deep(100_000)})
    s.case("nesting-message-quotes-a-piece", "an error about a 100 kB string value quotes only its start",
           ["eplb-plan", "--load", "{case}/load.json", "--gpus", "1"],
           err("{case}/load.json: layer 0: load 1 (a string \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...\") "
               "is not a non-negative number"),
           files={"load.json": '[[1, "' + "x" * 100_000 + '"]]'})
    s.case("nesting-message-describes-a-list", "an error about a nested list value describes it, never dump()s it",
           ["eplb-plan", "--load", "{case}/load.json", "--gpus", "1"],
           err("{case}/load.json: layer 0: load 1 (a list of 1 element) is not a non-negative number"),
           files={"load.json": "[[1, " + "[" * 60 + "]" * 60 + "]]"})


def size_arithmetic(s):
    s.case("size-replay-i64-shape-wraps", "replay topk_ids I64 [2^60, 1, 2]: 2^64 bytes wrapped to 0, then "
           "2^61 ids were read past the buffer",
           forward(extra=("--replay", "{case}/replay.safetensors")),
           err("{case}/replay.safetensors: tensor 'topk_ids': shape [1152921504606846976, 1, 2] of I64 is too large"),
           files={"replay.safetensors": safetensors_bytes(
               '{"topk_ids":{"dtype":"I64","shape":[1152921504606846976,1,2],"data_offsets":[0,0]}}')})
    s.case("size-f64-dimension-out-of-range", "a dimension of 2^64-1 next to a zero one (the product is 0)",
           forward(extra=("--replay", "{case}/replay.safetensors")),
           err("{case}/replay.safetensors: tensor 'x': shape dimension 18446744073709551615 is out of range"),
           files={"replay.safetensors": safetensors_bytes(
               '{"x":{"dtype":"F64","shape":[0,18446744073709551615],"data_offsets":[0,0]}}')})
    tid = "model.layers.0.ffn.gate.tid2eid"
    s.model_with_patched_tensors(
        "size-v4-tid2eid-shape-wraps", "DeepSeek-V4's hash-routing table I64 [2^59, 4] needed 0 bytes and was "
        "read past its buffer by the hash router", "deepseek_v4",
        (safetensors_bytes('{"' + tid + '":{"dtype":"I64","shape":[576460752303423488,4],"data_offsets":[0,0]}}'),
         [tid]),
        err("{case}/model/patch.safetensors: tensor '" + tid + "': shape [576460752303423488, 4] of I64 is too large"))


def signed_overflow(s):
    s.case("overflow-max-new-tokens", "--max-new-tokens 2^63-1 overflowed prompt + max-new-tokens",
           generate(model="{data}/qwen3_moe", extra=("--max-new-tokens", INT64_MAX)),
           err("--ids has 3 tokens and --max-new-tokens is 9223372036854775807: more than the model's "
               "max_position_embeddings of 256 positions"))
    s.case("overflow-eplb-redundant-experts", "--eplb-redundant-experts 2^63-1 overflowed experts + redundant",
           generate(model="{data}/qwen3_moe", extra=("--max-new-tokens", "1", "--eplb-redundant-experts", INT64_MAX)),
           err("--eplb-redundant-experts must be at most 4 x the model's 8 experts (32), got 9223372036854775807"))
    big = 4611686018427387904  # 2^62
    s.model_with_config("overflow-config-head-dim", "heads x head_dim overflowed", "qwen3_moe",
                        err("{case}/model/config.json: 'head_dim' = 4611686018427387904 is out of range "
                            "[-2147483648, 2147483647]"),
                        edit={"head_dim": big})
    s.model_with_config("overflow-config-num-attention-heads", "heads x head_dim overflowed", "qwen3_moe",
                        err("{case}/model/config.json: 'num_attention_heads' = 4611686018427387904 is out of range "
                            "[-2147483648, 2147483647]"),
                        edit={"num_attention_heads": big})
    s.model_with_config("overflow-config-v-head-dim", "v_head_dim x heads overflowed", "deepseek_v3",
                        err("{case}/model/config.json: 'v_head_dim' = 4611686018427387904 is out of range "
                            "[-2147483648, 2147483647]"),
                        edit={"v_head_dim": big})
    s.model_with_config("overflow-config-qk-nope-head-dim", "nope + rope dims overflowed", "deepseek_v3",
                        err("{case}/model/config.json: 'qk_nope_head_dim' = 9223372036854775807 is out of range "
                            "[-2147483648, 2147483647]"),
                        edit={"qk_nope_head_dim": int(INT64_MAX)})
    s.model_with_config("overflow-config-n-shared-experts", "n_shared_experts x moe_intermediate_size wrapped to "
                        "0: the shared experts were silently dropped", "deepseek_v3",
                        err("{case}/model/config.json: 'n_shared_experts' = 4611686018427387904 is out of range "
                            "[0, 65536]"),
                        edit={"n_shared_experts": big})
    s.model_with_config("overflow-config-hc-mult", "hc_mult overflowed the hyper-connection sizes", "deepseek_v4",
                        err("{case}/model/config.json: 'hc_mult' = 4611686018427387904 is out of range [1, 64]"),
                        edit={"hc_mult": big})


def hangs(s):
    qwen = "qwen3_moe"
    s.case("hang-fifo-config", "a FIFO as config.json blocked in open()", generate(),
           err("cannot read {case}/model/config.json: not a regular file"),
           setup=[{"fifo": "model/config.json"}, {"copy": qwen + "/model.safetensors", "to": "model/model.safetensors"}])
    s.case("hang-fifo-checkpoint", "a FIFO as model.safetensors blocked in open()", generate(),
           err("cannot read {case}/model/model.safetensors: not a regular file"),
           files={"model/config.json": (DATA / qwen / "config.json").read_text()},
           setup=[{"fifo": "model/model.safetensors"}])
    s.case("hang-fifo-index", "a FIFO as the checkpoint index blocked in open()", generate(),
           err("cannot read {case}/model/model.safetensors.index.json: not a regular file"),
           files={"model/config.json": (DATA / qwen / "config.json").read_text()},
           setup=[{"fifo": "model/model.safetensors.index.json"}])
    s.case("hang-fifo-shard", "a FIFO as a shard named by the index blocked in open()", generate(),
           err("cannot read {case}/model/shard.safetensors: not a regular file"),
           files={"model/config.json": (DATA / qwen / "config.json").read_text(),
                  "model/model.safetensors.index.json": '{"weight_map": {"lm_head.weight": "shard.safetensors"}}'},
           setup=[{"fifo": "model/shard.safetensors"}])
    for ext in ("json", "safetensors"):
        s.case(f"hang-fifo-replay-{ext}", f"a FIFO as a --replay {ext} file blocked in open()",
               forward(extra=("--replay", "{case}/replay." + ext)),
               err("cannot read {case}/replay." + ext + ": not a regular file"),
               setup=[{"fifo": "replay." + ext}])
    s.model_with_config("hang-config-num-hidden-layers", "num_hidden_layers 2^33 with a 3-layer checkpoint looped "
                        "before any tensor was checked", qwen,
                        err("{case}/model/config.json: 'num_hidden_layers' = 8589934592 is out of range [1, 4096]"),
                        edit={"num_hidden_layers": 8589934592})
    s.model_with_config("hang-config-num-hidden-layers-v4", "the same for DeepSeek-V4", "deepseek_v4",
                        err("{case}/model/config.json: 'num_hidden_layers' = 8589934592 is out of range [1, 4096]"),
                        edit={"num_hidden_layers": 8589934592})
    s.model_with_config("hang-config-layers-beyond-checkpoint", "1000 layers configured, 3 in the checkpoint: "
                        "refused before 1000 layers are built", qwen,
                        err("{case}/model/config.json: 'num_hidden_layers' is 1000 but the checkpoint has no tensor "
                            "'model.layers.999.input_layernorm.weight'"),
                        edit={"num_hidden_layers": 1000})
    s.model_with_config("hang-config-layers-beyond-checkpoint-v4", "the same for DeepSeek-V4", "deepseek_v4",
                        err("{case}/model/config.json: 'layer_types' lists 4 layers, 'num_hidden_layers' is 1000"),
                        edit={"num_hidden_layers": 1000})
    s.model_with_config("hang-config-hc-sinkhorn-iters", "hc_sinkhorn_iters 1e12 ran for hours", "deepseek_v4",
                        err("{case}/model/config.json: 'hc_sinkhorn_iters' = 1000000000000 is out of range [1, 1000]"),
                        edit={"hc_sinkhorn_iters": 1000000000000})
    s.case("hang-prompt-beyond-max-positions", "a 60000-token prompt ran for minutes on a model with "
           "max_position_embeddings 256", generate(model="{data}/qwen3_moe", ids=",".join(["1"] * 60000),
                                                   extra=("--max-new-tokens", "1")),
           err("--ids has 60000 tokens and --max-new-tokens is 1: more than the model's max_position_embeddings "
               "of 256 positions"))
    s.case("hang-forward-prompt-beyond-max-positions", "the same prompt given to forward",
           forward(ids=",".join(["1"] * 60000)),
           err("--ids has 60000 tokens, more than the model's max_position_embeddings of 256"))


def runaway_allocation(s):
    s.case("alloc-max-new-tokens-1e7", "--max-new-tokens 1e7 allocated ~7.7 GB of KV up front",
           generate(model="{data}/qwen3_moe", extra=("--max-new-tokens", "10000000")),
           err("--ids has 3 tokens and --max-new-tokens is 10000000: more than the model's "
               "max_position_embeddings of 256 positions"))
    s.case("alloc-eplb-redundant-experts-1e6", "--eplb-redundant-experts 1e6 allocated a million replicas",
           generate(model="{data}/qwen3_moe", extra=("--max-new-tokens", "1", "--eplb-redundant-experts", "1000000")),
           err("--eplb-redundant-experts must be at most 4 x the model's 8 experts (32), got 1000000"))
    s.case("alloc-eplb-plan-redundant-1e9", "eplb-plan --redundant-experts 1e9",
           ["eplb-plan", "--load", "{case}/load.json", "--redundant-experts", "1000000000"],
           err("--redundant-experts must be at most 4 x the 8 experts of the load file (32), got 1000000000"),
           files={"load.json": "[1, 2, 3, 4, 5, 6, 7, 8]"})
    s.case("alloc-sparse-index", "a 1 GiB checkpoint index is refused before it is read", forward(model="{case}/model"),
           err("cannot read {case}/model/model.safetensors.index.json: 1073741824 bytes, more than the 67108864 "
               "allowed for a checkpoint index"),
           files={"model/config.json": (DATA / "qwen3_moe" / "config.json").read_text(),
                  "model/model.safetensors.index.json": "{}"},
           setup=[{"sparse": "model/model.safetensors.index.json", "bytes": 1 << 30}])
    s.case("alloc-sparse-replay", "a 4 GiB replay file is refused before it is read",
           forward(extra=("--replay", "{case}/replay.json")),
           err("cannot read {case}/replay.json: 4294967296 bytes, more than the 268435456 allowed for a replay file"),
           files={"replay.json": "[]"}, setup=[{"sparse": "replay.json", "bytes": 1 << 32}])


def accepted_must_be_refused(s):
    ids = struct.pack("<18i", *([0, 1] * 9))
    header = '{"topk_ids":{"dtype":"I32","shape":[3,3,2],"data_offsets":[0,72]}} '
    s.case("refuse-header-length-one-short", "a header length one byte short shifted every tensor (all logits NaN, "
           "exit 0)", forward(extra=("--replay", "{case}/replay.safetensors")),
           err("{case}/replay.safetensors: data section is 73 bytes but the tensors cover 72 (is the header length "
               "right?)"),
           files={"replay.safetensors": safetensors_bytes(header, ids, header_len=len(header) - 1)})
    s.case("refuse-gap-between-tensors", "a gap between two data sections (the format forbids them)",
           forward(extra=("--replay", "{case}/replay.safetensors")),
           err("{case}/replay.safetensors: bytes [72, 76) of the data section belong to no tensor (before tensor "
               "'x')"),
           files={"replay.safetensors": safetensors_bytes(
               '{"topk_ids":{"dtype":"I32","shape":[3,3,2],"data_offsets":[0,72]},'
               '"x":{"dtype":"F32","shape":[1],"data_offsets":[76,80]}}', ids + bytes(8))})
    s.case("refuse-duplicate-tensor-names", "a tensor name twice in a header (the last one won)",
           forward(extra=("--replay", "{case}/replay.safetensors")),
           err("{case}/replay.safetensors: header: duplicate key 'topk_ids'"),
           files={"replay.safetensors": safetensors_bytes(
               '{"topk_ids":{"dtype":"I32","shape":[3,3,2],"data_offsets":[0,72]},'
               '"topk_ids":{"dtype":"I32","shape":[3,3,2],"data_offsets":[72,144]}}', ids + ids)})
    row = "[[0, 4294967297], [0, 1], [0, 1]]"
    s.case("refuse-replay-json-id-beyond-32-bits", "replay id 2^32+1 wrapped to 1",
           forward(extra=("--replay", "{case}/replay.json")),
           err("{case}/replay.json: row 0 MoE layer 0: expert id 4294967297 outside [0, 8)"),
           files={"replay.json": "[" + row + ", " + row + "]"})
    s.case("refuse-replay-safetensors-id-beyond-32-bits", "an I64 replay id 2^32 wrapped to 0",
           forward(extra=("--replay", "{case}/replay.safetensors")),
           err("{case}/replay.safetensors: row 0 MoE layer 2: expert id 4294967296 outside [0, 8)"),
           files={"replay.safetensors": safetensors_tensors(
               [("topk_ids", "I64", [1, 3, 2], struct.pack("<6q", 0, 1, 0, 1, 0, 1 << 32))])})
    s.case("refuse-replay-json-id-not-an-integer", "replay id 1e30 is a number, not an integer id",
           forward(extra=("--replay", "{case}/replay.json")),
           err("{case}/replay.json: row 0 MoE layer 0: a number 1e+30 is not an integer expert id"),
           files={"replay.json": "[[[0, 1e30], [0, 1], [0, 1]]]"})
    s.case("refuse-replay-safetensors-negative-id", "an I32 replay id -3",
           forward(extra=("--replay", "{case}/replay.safetensors")),
           err("{case}/replay.safetensors: row 0 MoE layer 1: expert id -3 outside [0, 8)"),
           files={"replay.safetensors": safetensors_tensors(
               [("topk_ids", "I32", [1, 3, 2], struct.pack("<6i", 0, 1, -3, 1, 0, 1))])})
    s.case("refuse-replay-wrong-layer-count", "a routing for 2 MoE layers given to a model with 3",
           forward(extra=("--replay", "{case}/replay.safetensors")),
           err("{case}/replay.safetensors: the routing has 2 MoE layers, the model has 3"),
           files={"replay.safetensors": safetensors_tensors(
               [("topk_ids", "I32", [1, 2, 2], struct.pack("<4i", 0, 1, 0, 1))])})
    s.model_with_config("refuse-config-eos-beyond-32-bits", "eos_token_id 4294967364 was truncated to 68",
                        "qwen3_moe", err("{case}/model/config.json: 'eos_token_id' = 4294967364 is out of range "
                                         "[-2147483648, 2147483647]"),
                        edit={"eos_token_id": 4294967364})
    s.model_with_config("refuse-config-eos-list-beyond-32-bits", "the same in a list of eos ids", "qwen3_moe",
                        err("{case}/model/config.json: 'eos_token_id' = 4294967364 is out of range "
                            "[-2147483648, 2147483647]"),
                        edit={"eos_token_id": [1, 4294967364]})
    s.model_with_config("refuse-config-integer-beyond-int64", "2^64-1 would wrap to -1 through get<int64_t>()",
                        "qwen3_moe",
                        err("{case}/model/config.json: 'eos_token_id' = 18446744073709551615 is out of range "
                            "(larger than int64)"),
                        edit={"eos_token_id": 18446744073709551615})
    for layers in (0, -1):
        s.model_with_config(f"refuse-config-v4-{'zero' if layers == 0 else 'negative'}-layers",
                            f"DeepSeek-V4 with {layers} layers was accepted", "deepseek_v4",
                            err(f"{{case}}/model/config.json: 'num_hidden_layers' = {layers} is out of range [1, 4096]"),
                            edit={"num_hidden_layers": layers})
    s.model_with_config("refuse-config-negative-shared-experts", "n_shared_experts -1 was accepted", "deepseek_v3",
                        err("{case}/model/config.json: 'n_shared_experts' = -1 is out of range [0, 65536]"),
                        edit={"n_shared_experts": -1})
    for name, shard in [("dotdot", "../outside.safetensors"), ("absolute", "/etc/passwd"),
                        ("inner-dotdot", "sub/../../outside.safetensors"), ("empty", "")]:
        s.case(f"refuse-shard-path-{name}", f"shard path {shard} leaves the model folder (one printed the first "
               "bytes of a system file)", forward(model="{case}/model"),
               err("{case}/model/model.safetensors.index.json: weight_map['lm_head.weight']: shard path '" + shard +
                   "' is not a file name inside the model folder"),
               files={"model/config.json": (DATA / "qwen3_moe" / "config.json").read_text(),
                      "model/model.safetensors.index.json":
                          json.dumps({"weight_map": {"lm_head.weight": shard}})},
               setup=[{"copy": "qwen3_moe/model.safetensors", "to": "outside.safetensors"}])
    tid = "model.layers.0.ffn.gate.tid2eid"
    vocab, k = fixture_header("deepseek_v4")[tid]["shape"]
    table = [[(row + j) % 8 for j in range(k)] for row in range(vocab)]
    table[5][1] = table[5][0]
    s.model_with_patched_tensors(
        "refuse-v4-tid2eid-repeated-expert", "a hash-routing row naming one expert twice", "deepseek_v4",
        [(tid, "I64", [vocab, k], struct.pack(f"<{vocab * k}q", *[e for r in table for e in r]))],
        err(f"hash routing table '{tid}': token 5 lists expert {table[5][0]} twice"))


def messages(s):
    qwen_config = (DATA / "qwen3_moe" / "config.json").read_text()
    s.case("message-symlink-loop", "a symlink loop as the checkpoint was an internal error", forward(model="{case}/model"),
           err("cannot read {case}/model/model.safetensors: Too many levels of symbolic links"),
           files={"model/config.json": qwen_config},
           setup=[{"symlink": "model.safetensors", "at": "model/model.safetensors"}])
    s.case("message-directory-as-checkpoint", "a folder where model.safetensors should be was an internal error",
           forward(model="{case}/model"), err("cannot read {case}/model/model.safetensors: not a regular file"),
           files={"model/config.json": qwen_config}, setup=[{"mkdir": "model/model.safetensors"}])
    s.case("message-directory-as-replay", "a folder given as --replay", forward(extra=("--replay", "{case}/replay")),
           err("cannot read {case}/replay: not a regular file"), setup=[{"mkdir": "replay"}])
    s.model_with_config("message-config-layer-types-not-strings", "non-string layer_types was an internal error",
                        "gpt_oss", err("{case}/model/config.json: 'layer_types' must hold strings, found an integer"),
                        edit={"layer_types": [1, 2]})
    s.model_with_config("message-config-mlp-layer-types-not-strings", "the same for DeepSeek-V4's mlp_layer_types",
                        "deepseek_v4", err("{case}/model/config.json: 'mlp_layer_types' must hold strings, found an "
                                           "integer"),
                        edit={"mlp_layer_types": [1, 2, 3, 4]})
    s.case("message-symlink-loop-replay", "a symlink loop as --replay", forward(extra=("--replay", "{case}/loop.json")),
           err("cannot read {case}/loop.json: Too many levels of symbolic links"),
           setup=[{"symlink": "loop.json", "at": "loop.json"}])
    s.case("message-symlink-loop-eplb-load", "a symlink loop as eplb-plan --load",
           ["eplb-plan", "--gpus", "1", "--load", "{case}/loop.json"],
           err("cannot read {case}/loop.json: Too many levels of symbolic links"),
           setup=[{"symlink": "loop.json", "at": "loop.json"}])
    s.case("message-eplb-window-int64-max", "--eplb-window 2^63-1 was an internal error",
           generate(model="{data}/qwen3_moe",
                    extra=("--max-new-tokens", "1", "--eplb-window", INT64_MAX, "--eplb-rebalance-every", "1")),
           err("--eplb-window must be in [1, 100000] steps, got 9223372036854775807"))
    s.case("message-ids-with-newline", "--ids '1\\n2' printed two lines",
           generate(model="{data}/qwen3_moe", ids="1\n2"),
           err("bad token id '1\\n2' in --ids (expected comma-separated non-negative integers)"))


def nan_making(s):
    qwen = "qwen3_moe"
    s.model_with_config("nan-config-negative-rms-norm-eps", "a negative rms_norm_eps makes every logit NaN", qwen,
                        err("{case}/model/config.json: 'rms_norm_eps' must be >= 0, got -1e-06"),
                        edit={"rms_norm_eps": -1e-6})
    s.model_with_config("nan-config-zero-rope-theta", "rope_theta 0 makes every logit NaN", qwen,
                        err("{case}/model/config.json: 'rope_theta' must be positive, got 0"),
                        edit={"rope_parameters": {"rope_type": "default", "rope_theta": 0}})
    s.model_with_config("nan-config-negative-rope-theta", "a negative rope_theta makes every logit NaN", qwen,
                        err("{case}/model/config.json: 'rope_theta' must be positive, got -10000"),
                        edit={"rope_parameters": {"rope_type": "default", "rope_theta": -1e4}})
    s.model_with_config("nan-config-v4-negative-rms-norm-eps", "the same for DeepSeek-V4", "deepseek_v4",
                        err("{case}/model/config.json: 'rms_norm_eps' must be >= 0, got -1"),
                        edit={"rms_norm_eps": -1})
    s.model_with_config("nan-config-v4-zero-rope-theta", "the same for DeepSeek-V4", "deepseek_v4",
                        err("{case}/model/config.json: 'rope_theta' must be positive, got 0"),
                        edit={"rope_theta": 0})
    s.model_with_config("nan-config-yarn-factor-zero", "a YaRN factor of 0 makes every logit NaN", qwen,
                        err("{case}/model/config.json: rope scaling 'factor' must be positive, got 0"),
                        edit={"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 0,
                                                  "original_max_position_embeddings": 64}})
    s.model_with_config("nan-config-v4-compress-rope-theta", "DeepSeek-V4's compress_rope_theta -1", "deepseek_v4",
                        err("{case}/model/config.json: 'compress_rope_theta' must be positive, got -1"),
                        edit={"compress_rope_theta": -1})
    nan = struct.pack("<f", float("nan"))
    norm = [("model.norm.weight", "F32", [64], nan + struct.pack("<63f", *([1.0] * 63)))]
    s.model_with_patched_tensors(
        "nan-weights-generate", "a NaN weight made NaN logits and generate sampled from them with exit 0", qwen, norm,
        err("the model produced a non-finite logit (nan) for token 0 at position 2: the checkpoint holds NaN or "
            "infinite weights, or activations overflowed"))
    s.model_with_patched_tensors(
        "nan-weights-forward", "forward printed and dumped NaN logits with exit 0", qwen, norm,
        err("the model produced a non-finite logit (nan) for token 0 at position 0: the checkpoint holds NaN or "
            "infinite weights, or activations overflowed"), args=forward(model="{case}/model"))


def quantized(s):
    """FP8 block-scaled checkpoints (quantization_config quant_method "fp8") that cannot run exactly, and
    quantization methods r3 does not run."""
    qwen = "qwen3_moe"
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    scale = q_proj + "_scale_inv"
    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [16, 16]}
    weight = (q_proj, "F8_E4M3", [64, 64], bytes([0x38]) * 64 * 64)  # every element 1.0
    ones = struct.pack("<16f", *([1.0] * 16))
    s.model_with_patched_tensors(
        "quant-missing-scale", "an F8_E4M3 weight without its weight_scale_inv", qwen, [weight],
        err(f"tensor '{q_proj}' is stored as F8_E4M3, but the checkpoint has no block scales '{scale}' (expected "
            "[4, 4] for blocks of [16, 16])"), config_edit={"quantization_config": fp8})
    s.model_with_patched_tensors(
        "quant-scale-wrong-shape", "block scales of the wrong shape for the block size", qwen,
        [weight, (scale, "F32", [4, 3], ones[:48])],
        err(f"block scales '{scale}' in {{case}}/model/patch.safetensors have shape [4, 3], expected [4, 4] (weight "
            "[64, 64] in blocks of [16, 16])"), config_edit={"quantization_config": fp8})
    s.model_with_patched_tensors(
        "quant-scale-wrong-dtype", "integer block scales", qwen, [weight, (scale, "I32", [4, 4], bytes(64))],
        err(f"block scales '{scale}' in {{case}}/model/patch.safetensors have dtype I32, expected F32, BF16 or F16"),
        config_edit={"quantization_config": fp8})
    s.model_with_patched_tensors(
        "quant-fp8-without-config", "an F8_E4M3 weight in a checkpoint without quantization_config", qwen,
        [weight, (scale, "F32", [4, 4], ones)],
        err(f"tensor '{q_proj}' in {{case}}/model/patch.safetensors is stored as F8_E4M3, but {{case}}/model/config.json "
            'has no quantization_config (quant_method "fp8" with weight_block_size)'))
    where = "{case}/model/config.json: quantization_config"
    s.model_with_config("quant-unknown-method", "quant_method awq, which r3 does not run", qwen,
                        err(f"{where}.quant_method 'awq' is not supported (r3 runs block-scaled \"fp8\" and GPT-OSS's "
                            "\"mxfp4\" checkpoints)"),
                        edit={"quantization_config": {"quant_method": "awq"}})
    s.model_with_config("quant-unknown-fmt", "fp8 in e5m2", qwen,
                        err(f"{where}.fmt 'e5m2' is not supported (r3 runs \"e4m3\")"),
                        edit={"quantization_config": dict(fp8, fmt="e5m2")})
    s.model_with_config("quant-unknown-scale-fmt", "fp8 with scale_fmt e5m2 (not float or ue8m0)", qwen,
                        err(f"{where}.scale_fmt 'e5m2' is not supported (r3 runs \"float\" and DeepSeek-V4's \"ue8m0\" "
                            "power-of-two scales)"),
                        edit={"quantization_config": dict(fp8, scale_fmt="e5m2")})
    s.model_with_patched_tensors(
        "quant-ue8m0-scale-not-power-of-two", "scale_fmt ue8m0 with a block scale of 1.5", qwen,
        [weight, (scale, "F32", [4, 4], struct.pack("<16f", *([1.0] * 5 + [1.5] + [1.0] * 10)))],
        err(f"block scales '{scale}' in {{case}}/model/patch.safetensors hold 1.5 at 5, but {{case}}/model/config.json "
            'says scale_fmt "ue8m0" (positive powers of two)'),
        config_edit={"quantization_config": dict(fp8, scale_fmt="ue8m0")})
    s.model_with_config("quant-block-size-malformed", "weight_block_size with one size", qwen,
                        err(f"{where}.weight_block_size must be two block sizes in [1, 1048576], e.g. [128, 128]"),
                        edit={"quantization_config": dict(fp8, weight_block_size=[128])})


def quantized_mxfp4(s):
    """GPT-OSS checkpoints with MXFP4 experts (quant_method "mxfp4", `*_blocks` and `*_scales` as OpenAI
    publishes them) that cannot run exactly: layer 0's gate_up_proj replaced by broken blocks or scales."""
    gpt, qwen = "gpt_oss", "qwen3_moe"
    stack = "model.layers.0.mlp.experts.gate_up_proj"
    blocks_name, scales_name = stack + "_blocks", stack + "_scales"
    mxfp4 = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                 "model.embed_tokens", "lm_head"]}
    # The fixture: 8 experts, hidden 64, intermediate 32: gate_up_proj_blocks [8, 2 * 32, 64 / 32, 16].
    blocks = (blocks_name, "U8", [8, 64, 2, 16], bytes([0x22]) * (8 * 64 * 2 * 16))  # every value 1.0
    scales = (scales_name, "U8", [8, 64, 2], bytes([127]) * (8 * 64 * 2))  # every scale 2^0
    patched = lambda name, about, tensors, stderr, config=mxfp4: s.model_with_patched_tensors(
        name, about, gpt, tensors, stderr, drop=(stack,),
        config_edit=None if config is None else {"quantization_config": config})
    patch = "{case}/model/patch.safetensors"
    patched("quant-mxfp4-missing-scales", "MXFP4 blocks without their scales", [blocks],
            err(f"MXFP4 blocks '{blocks_name}' have no scales '{scales_name}' in the checkpoint (expected U8 [8, 64, 2]: "
                "one e8m0 exponent per 32 values)"))
    patched("quant-mxfp4-scales-wrong-shape", "MXFP4 scales for a block of 64 values",
            [blocks, (scales_name, "U8", [8, 64, 1], bytes([127]) * 512)],
            err(f"MXFP4 scales '{scales_name}' in {patch} have shape [8, 64, 1], expected [8, 64, 2] (one per 32 values "
                "of blocks [8, 64, 2, 16])"))
    patched("quant-mxfp4-scales-wrong-dtype", "MXFP4 scales widened to bfloat16",
            [blocks, (scales_name, "BF16", [8, 64, 2], struct.pack("<H", 0x3F80) * 1024)],
            err(f"MXFP4 scales '{scales_name}' in {patch} have dtype BF16, expected U8 (e8m0 exponents)"))
    patched("quant-mxfp4-blocks-wrong-shape", "MXFP4 blocks with the 16 bytes of a block flattened into the row",
            [(blocks_name, "U8", [8, 64, 32], blocks[3]), scales],
            err(f"tensor '{blocks_name}' in {patch} has shape [8, 64, 32], expected [8, 64, 2, 16]"))
    patched("quant-mxfp4-blocks-wrong-dtype", "MXFP4 blocks stored as F8_E4M3",
            [(blocks_name, "F8_E4M3", [8, 64, 2, 16], blocks[3]), scales],
            err(f"MXFP4 blocks '{blocks_name}' in {patch} have dtype F8_E4M3, expected U8 (two e2m1 values per byte)"))
    nan = bytearray(scales[3])
    nan[(3 * 64 + 10) * 2 + 1] = 255
    patched("quant-mxfp4-nan-scale", "an e8m0 scale of 255 (NaN in the OCP MX format) made 32 weights NaN",
            [blocks, (scales_name, "U8", [8, 64, 2], bytes(nan))],
            err(f"MXFP4 scales '{scales_name}' in {patch} hold 255 (e8m0's NaN) at [3, 10, 1]: those 32 weights would "
                "be NaN"))
    patched("quant-mxfp4-without-config", "MXFP4 blocks in a checkpoint without quantization_config",
            [blocks, scales],
            err(f"tensor '{blocks_name}' in {patch} holds MXFP4 blocks, but {{case}}/model/config.json has no "
                'quantization_config (quant_method "mxfp4")'), config=None)
    excluding = dict(mxfp4, modules_to_not_convert=mxfp4["modules_to_not_convert"] + ["model.layers.*.mlp.experts"])
    patched("quant-mxfp4-excluded", "MXFP4 blocks in a module that modules_to_not_convert leaves unquantized",
            [blocks, scales],
            err(f"tensor '{blocks_name}' in {patch} holds MXFP4 blocks, but {{case}}/model/config.json lists "
                "'model.layers.*.mlp.experts' in quantization_config.modules_to_not_convert"), config=excluding)
    s.model_with_config("quant-mxfp4-missing-blocks", "an mxfp4 quantization_config over unquantized experts", gpt,
                        err(f"checkpoint {{case}}/model is missing tensor '{blocks_name}' (expected shape "
                            "[8, 64, 2, 16])"),
                        edit={"quantization_config": mxfp4})
    s.model_with_config("quant-mxfp4-wrong-family", "quant_method mxfp4 on a family without GPT-OSS's experts", qwen,
                        err("{case}/model/config.json: quantization_config.quant_method 'mxfp4' stores GPT-OSS's fused "
                            "experts (gate_up_proj_blocks, down_proj_blocks); qwen3_moe has no such experts"),
                        edit={"quantization_config": mxfp4})
    s.model_with_config("quant-mxfp4-intermediate-size", "MXFP4 experts of a width no 32-value block divides", gpt,
                        err("{case}/model/config.json: MXFP4 experts need 'intermediate_size' to be a multiple of 32 "
                            "(one e8m0 scale per 32 values), got 16"),
                        edit={"quantization_config": mxfp4, "intermediate_size": 16})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "tests" / "malformed"))
    out = Path(parser.parse_args().out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    s = Suite(out)
    for group in (nesting, size_arithmetic, signed_overflow, hangs, runaway_allocation, accepted_must_be_refused,
                  messages, nan_making, quantized, quantized_mxfp4):
        group(s)
    lines = ["# Malformed inputs", "",
             "Written by `tools/make_malformed_inputs.py` (do not edit by hand); run by",
             "`tests/test_malformed_inputs.cpp`. One folder per case: the files, and `case.json` with the command,",
             "the setup steps, the exit status and the exact one-line message expected.", ""]
    lines += [f"- `{name}`: {about}" for name, about in s.cases]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {len(s.cases)} cases to {out}")


if __name__ == "__main__":
    main()
