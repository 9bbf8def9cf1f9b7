#include "io/checkpoint.h"

#include <cmath>
#include <filesystem>
#include <cstring>

#include "io/json_file.h"
#include "io/input_file.h"
#include "io/mapped_file.h"

namespace r3 {

namespace fs = std::filesystem;

namespace {

// A shard named by the index must be a file inside the model folder: a relative path with no
// '..' component (symlinks inside the folder are followed, as the Hugging Face cache uses them).
bool stays_inside(const std::string& shard) {
  const fs::path p(shard);
  if (shard.empty() || p.is_absolute() || p.has_root_name() || p.has_root_directory()) return false;
  for (const auto& part : p) {
    if (part == "..") return false;
  }
  return p.has_filename();
}

std::map<std::string, std::string> read_index(const fs::path& index_path) {
  const std::string ip = index_path.string();
  const nlohmann::json j = read_json_file(ip, kMaxIndexBytes, "a checkpoint index");
  R3_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), ip,
           ": missing object 'weight_map'");
  std::map<std::string, std::string> map;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    R3_CHECK(it.value().is_string(), ip, ": weight_map['", brief(it.key()), "'] is not a file name");
    const auto& shard = it.value().get_ref<const std::string&>();
    R3_CHECK(stays_inside(shard), ip, ": weight_map['", brief(it.key()), "']: shard path '", brief(shard),
             "' is not a file name inside the model folder");
    map[it.key()] = shard;
  }
  return map;
}

// Whether `p` names something (a dangling or looping symlink does too: opening it says why it
// cannot be read). Never throws, unlike fs::exists on a symlink loop.
bool present(const fs::path& p) {
  std::error_code ec;
  return fs::symlink_status(p, ec).type() != fs::file_type::not_found && !ec;
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  const fs::path root(dir);
  std::error_code ec;
  R3_CHECK(fs::is_directory(root, ec), "model folder ", dir, " does not exist or is not a folder");
  const fs::path index = root / "model.safetensors.index.json";
  const fs::path single = root / "model.safetensors";

  if (present(index)) {
    std::map<std::string, std::shared_ptr<const SafetensorsFile>> shards;
    for (const auto& [name, shard] : read_index(index)) {
      auto& file = shards[shard];
      if (!file) {
        const fs::path shard_path = root / shard;
        R3_CHECK(present(shard_path), index.string(), " lists shard ", brief(shard), " (for tensor '", brief(name),
                 "') but the file is missing");
        file = SafetensorsFile::open(shard_path.string());
        ckpt.files_.push_back(file);
      }
      R3_CHECK(file->find(name) != nullptr, index.string(), " maps tensor '", brief(name), "' to ", brief(shard),
               " but that shard does not contain it");
      ckpt.where_[name] = file.get();
    }
  } else if (present(single)) {
    auto file = SafetensorsFile::open(single.string());
    for (const auto& [name, e] : file->entries()) ckpt.where_[name] = file.get();
    ckpt.files_.push_back(std::move(file));
  } else {
    R3_FAIL("no checkpoint in ", dir,
            ": expected model.safetensors or model.safetensors.index.json");
  }
  return ckpt;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, file] : where_) {
    const auto* e = file->find(name);
    total += e->end - e->begin;
  }
  return total;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : where_) names.push_back(name);
  return names;
}

uint64_t Checkpoint::stored_bytes(const std::string& name) const {
  auto it = where_.find(name);
  R3_CHECK(it != where_.end(), "checkpoint ", dir_, " has no tensor '", name, "'");
  const SafetensorsEntry* e = it->second->find(name);
  return e->end - e->begin;
}

Shape Checkpoint::shape(const std::string& name) const {
  auto it = where_.find(name);
  R3_CHECK(it != where_.end(), "checkpoint ", dir_, " has no tensor '", name, "'");
  return it->second->find(name)->shape;
}

const SafetensorsEntry& Checkpoint::entry(const std::string& name, const Shape& expected) const {
  auto it = where_.find(name);
  R3_CHECK(it != where_.end(), "checkpoint ", dir_, " is missing tensor '", name,
           "' (expected shape ", shape_to_string(expected), ")");
  const SafetensorsEntry& e = *it->second->find(name);
  R3_CHECK(e.shape == expected, "tensor '", name, "' in ", it->second->path(),
           " has shape ", shape_to_string(e.shape), ", expected ", shape_to_string(expected));
  loaded_.insert(name);
  reads_.push_back(name);
  if (on_load_) on_load_(e.end - e.begin);
  return e;
}

Tensor Checkpoint::load_f32(const std::string& name, const Shape& expected) const {
  const SafetensorsEntry& e = entry(name, expected);
  if (e.dtype == DType::F8_E4M3) return to_f32(block_scaled(name, e));
  return widened(name, e);
}

Tensor Checkpoint::block_scaled(const std::string& name, const SafetensorsEntry& e) const {
  const std::string& file = where_.at(name)->path();
  R3_CHECK(quantization_.fp8(), "tensor '", name, "' in ", file, " is stored as F8_E4M3, but ",
           quantization_.source.empty() ? dir_ + "/config.json" : quantization_.source,
           quantization_.mxfp4() ? "'s quantization_config is quant_method \"mxfp4\" (FP8 weights need \"fp8\" "
                                   "with weight_block_size)"
                                 : " has no quantization_config (quant_method \"fp8\" with weight_block_size)");
  R3_CHECK(e.shape.size() == 2, "tensor '", name, "' in ", file, ": F8_E4M3 ", shape_to_string(e.shape),
           " is not a weight matrix");
  const std::string excluded = quantization_.excluded_by(name);
  R3_CHECK(excluded.empty(), "tensor '", name, "' in ", file, " is stored as F8_E4M3, but ", quantization_.source,
           " lists '", excluded, "' in quantization_config.modules_to_not_convert");
  // `<name>_scale_inv`, or DeepSeek-V4-Flash's `<module>.scale` for `<module>.weight`.
  std::string scale_name = name + "_scale_inv";
  constexpr std::string_view kWeight = ".weight";
  if (!where_.contains(scale_name) && name.ends_with(kWeight)) {
    const std::string module_scale = name.substr(0, name.size() - kWeight.size()) + ".scale";
    if (where_.contains(module_scale)) scale_name = module_scale;
  }
  const int64_t br = quantization_.block_rows, bc = quantization_.block_cols;
  const Shape grid{(e.shape[0] + br - 1) / br, (e.shape[1] + bc - 1) / bc};
  auto it = where_.find(scale_name);
  R3_CHECK(it != where_.end(), "tensor '", name, "' is stored as F8_E4M3, but the checkpoint has no block scales '",
           scale_name, "' (expected ", shape_to_string(grid), " for blocks of [", br, ", ", bc, "])");
  const SafetensorsEntry& se = *it->second->find(scale_name);
  R3_CHECK(se.dtype == DType::F32 || se.dtype == DType::BF16 || se.dtype == DType::F16, "block scales '", scale_name,
           "' in ", it->second->path(), " have dtype ", dtype_name(se.dtype), ", expected F32, BF16 or F16");
  R3_CHECK(se.shape == grid, "block scales '", scale_name, "' in ", it->second->path(), " have shape ",
           shape_to_string(se.shape), ", expected ", shape_to_string(grid), " (weight ", shape_to_string(e.shape),
           " in blocks of [", br, ", ", bc, "])");
  BlockScales scales;
  scales.scales = widened(scale_name, entry(scale_name, grid));
  if (quantization_.power_of_two_scales) {
    const float* v = scales.scales.data<float>();
    for (int64_t i = 0; i < scales.scales.numel(); ++i) {
      int exponent = 0;
      R3_CHECK(std::isfinite(v[i]) && v[i] > 0 && std::frexp(v[i], &exponent) == 0.5f, "block scales '", scale_name,
               "' in ", it->second->path(), " hold ", v[i], " at ", i, ", but ", quantization_.source,
               " says scale_fmt \"ue8m0\" (positive powers of two)");
    }
  }
  scales.block_rows = br;
  scales.block_cols = bc;
  Tensor stored = where_.at(name)->view(name);
  prefetch(stored.raw_data(), stored.nbytes());
  return stored.with_block_scales(std::move(scales));  // bytes need no alignment: zero-copy
}

bool Checkpoint::stores_mxfp4(const std::string& name) const {
  return contains(name + "_blocks") || (quantization_.mxfp4() && quantization_.excluded_by(name).empty());
}

Tensor Checkpoint::load_mxfp4(const std::string& name, const Shape& expected) const {
  constexpr int64_t kBlock = MxScales::kBlock, kBlockBytes = kBlock / 2;
  R3_CHECK(expected.size() >= 2 && expected.back() > 0 && expected.back() % kBlock == 0, "MXFP4 weight '", name,
           "': ", shape_to_string(expected), " values, expected rows of a multiple of ", kBlock);
  const int64_t cols = expected.back(), groups = cols / kBlock;
  const std::string blocks_name = name + "_blocks", scales_name = name + "_scales";
  Shape block_shape(expected.begin(), expected.end() - 1), scale_shape = block_shape;
  block_shape.push_back(groups);
  block_shape.push_back(kBlockBytes);
  scale_shape.push_back(groups);
  const SafetensorsEntry& b = entry(blocks_name, block_shape);
  const std::string& file = where_.at(blocks_name)->path();
  R3_CHECK(b.dtype == DType::U8, "MXFP4 blocks '", blocks_name, "' in ", file, " have dtype ", dtype_name(b.dtype),
           ", expected U8 (two e2m1 values per byte)");
  const std::string config = quantization_.source.empty() ? dir_ + "/config.json" : quantization_.source;
  R3_CHECK(quantization_.mxfp4(), "tensor '", blocks_name, "' in ", file, " holds MXFP4 blocks, but ", config,
           quantization_.fp8() ? "'s quantization_config is quant_method \"fp8\", not \"mxfp4\""
                               : " has no quantization_config (quant_method \"mxfp4\")");
  const std::string excluded = quantization_.excluded_by(name);
  R3_CHECK(excluded.empty(), "tensor '", blocks_name, "' in ", file, " holds MXFP4 blocks, but ", config, " lists '",
           excluded, "' in quantization_config.modules_to_not_convert");
  auto it = where_.find(scales_name);
  R3_CHECK(it != where_.end(), "MXFP4 blocks '", blocks_name, "' have no scales '", scales_name, "' in the checkpoint ",
           "(expected U8 ", shape_to_string(scale_shape), ": one e8m0 exponent per ", kBlock, " values)");
  const SafetensorsEntry& se = *it->second->find(scales_name);
  R3_CHECK(se.dtype == DType::U8, "MXFP4 scales '", scales_name, "' in ", it->second->path(), " have dtype ",
           dtype_name(se.dtype), ", expected U8 (e8m0 exponents)");
  R3_CHECK(se.shape == scale_shape, "MXFP4 scales '", scales_name, "' in ", it->second->path(), " have shape ",
           shape_to_string(se.shape), ", expected ", shape_to_string(scale_shape), " (one per ", kBlock,
           " values of blocks ", shape_to_string(block_shape), ")");
  entry(scales_name, scale_shape);
  const int64_t rows = shape_numel(Shape(expected.begin(), expected.end() - 1));
  const Tensor scales = where_.at(scales_name)->view(scales_name).reshaped({rows, groups});
  // e8m0 255 is NaN (OCP MX): every value of its block would be NaN. Reading the scales (1/16 of
  // the blocks' bytes) also brings their pages in.
  const auto* s = static_cast<const uint8_t*>(scales.raw_data());
  const auto* nan = static_cast<const uint8_t*>(std::memchr(s, 255, static_cast<std::size_t>(scales.numel())));
  if (nan != nullptr) {
    Shape at = scale_shape;  // the index of the first 255
    for (int64_t rest = nan - s, d = static_cast<int64_t>(at.size()) - 1; d >= 0; --d) {
      at[static_cast<std::size_t>(d)] = rest % scale_shape[static_cast<std::size_t>(d)];
      rest /= scale_shape[static_cast<std::size_t>(d)];
    }
    R3_FAIL("MXFP4 scales '", scales_name, "' in ", it->second->path(), " hold 255 (e8m0's NaN) at ",
            shape_to_string(at), ": those ", kBlock, " weights would be NaN");
  }
  Tensor blocks = where_.at(blocks_name)->view(blocks_name).reinterpreted(DType::F4_E2M1X2, {rows, cols / 2});
  prefetch(blocks.raw_data(), blocks.nbytes());
  return blocks.with_mx_scales(scales);  // bytes need no alignment: zero-copy
}

Tensor Checkpoint::widened(const std::string& name, const SafetensorsEntry& e) const {
  R3_CHECK(e.dtype == DType::F32 || e.dtype == DType::BF16 || e.dtype == DType::F16 ||
               e.dtype == DType::F64,
           "tensor '", name, "' has dtype ", dtype_name(e.dtype),
           ", expected a floating type (F32, BF16, F16)");
  Tensor stored = where_.at(name)->view(name);
  const bool aligned = reinterpret_cast<uintptr_t>(stored.raw_data()) % alignof(float) == 0;
  if (e.dtype == DType::F32 && aligned) {  // zero-copy
    prefetch(stored.raw_data(), stored.nbytes());
    return stored;
  }
  Tensor out = Tensor::empty(DType::F32, e.shape);
  convert_to_f32(stored.raw_data(), e.dtype, static_cast<std::size_t>(out.numel()),
                 out.data<float>());
  return out;
}

Tensor Checkpoint::load_weight(const std::string& name, const Shape& expected) const {
  const SafetensorsEntry& e = entry(name, expected);
  if (e.dtype == DType::F8_E4M3) return block_scaled(name, e);
  if (e.dtype != DType::F32 && e.dtype != DType::BF16 && e.dtype != DType::F16) return widened(name, e);
  Tensor stored = where_.at(name)->view(name);
  const bool aligned = reinterpret_cast<uintptr_t>(stored.raw_data()) % dtype_size(e.dtype) == 0;
  if (!aligned) {
    Tensor copy = Tensor::empty(e.dtype, e.shape);
    std::memcpy(copy.raw_data(), stored.raw_data(), copy.nbytes());
    return copy;
  }
  prefetch(stored.raw_data(), stored.nbytes());
  return stored;
}

Tensor Checkpoint::load_raw(const std::string& name, const Shape& expected) const {
  const SafetensorsEntry& e = entry(name, expected);
  Tensor stored = where_.at(name)->view(name);
  Tensor out = Tensor::empty(e.dtype, e.shape);  // copy: aligned for its element type
  std::memcpy(out.raw_data(), stored.raw_data(), out.nbytes());
  return out;
}

std::vector<std::string> Checkpoint::take_reads() const {
  std::vector<std::string> reads;
  reads.swap(reads_);
  return reads;
}

std::vector<std::string> Checkpoint::unused() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : where_) {
    if (!loaded_.count(name)) names.push_back(name);
  }
  return names;
}

}  // namespace r3
