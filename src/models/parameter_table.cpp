#include "models/parameter_table.h"

#include "io/mapped_file.h"


namespace r3::models {

const char* parameter_form_name(ParameterForm form) {
  switch (form) {
    case ParameterForm::kFloat32:
      return "float32";
    case ParameterForm::kStored:
      return "as stored";
    case ParameterForm::kMxfp4:
      return "mxfp4";
    case ParameterForm::kRaw:
      return "raw";
  }
  return "?";
}

void ParameterTable::add(Parameter parameter) {
  R3_CHECK(!parameter.stored.empty(), "parameter '", parameter.name, "' reads no checkpoint tensor");
  for (const std::string& stored : parameter.stored) {
    const auto it = by_stored_.find(stored);
    R3_CHECK(it == by_stored_.end(), "checkpoint tensor '", stored, "' is loaded twice (for '", parameter.name,
             "', already for '", parameters_[it->second].name, "')");
  }
  for (const std::string& stored : parameter.stored) by_stored_.emplace(stored, parameters_.size());
  parameters_.push_back(std::move(parameter));
}

void ParameterTable::relocate(const std::string& name, Tensor tensor) {
  const auto it = by_stored_.find(name);
  R3_CHECK(it != by_stored_.end() && parameters_[it->second].name == name, "relocating parameter '", name,
           "': no parameter of that name");
  Parameter& p = parameters_[it->second];
  R3_CHECK(tensor.dtype() == p.tensor.dtype() && tensor.numel() == p.tensor.numel(), "relocating parameter '", name,
           "': ", dtype_name(tensor.dtype()), " ", shape_to_string(tensor.shape()), " for ", dtype_name(p.tensor.dtype()),
           " ", shape_to_string(p.tensor.shape()));
  p.tensor = std::move(tensor);
}

const Parameter* ParameterTable::find(const std::string& stored_name) const {
  const auto it = by_stored_.find(stored_name);
  return it == by_stored_.end() ? nullptr : &parameters_[it->second];
}

const Parameter& ParameterTable::at(const std::string& stored_name) const {
  const Parameter* parameter = find(stored_name);
  R3_CHECK(parameter != nullptr, "unknown tensor '", stored_name, "': not a parameter of this model (it has ",
           parameters_.size(), " parameters reading ", by_stored_.size(), " checkpoint tensors)");
  return *parameter;
}

std::vector<std::string> ParameterTable::stored_names() const {
  std::vector<std::string> names;
  names.reserve(by_stored_.size());
  for (const auto& [name, index] : by_stored_) names.push_back(name);
  return names;  // a std::map's keys: sorted
}

int64_t ParameterTable::release_mapped_pages() const {
  const auto release = [](const Tensor& t) -> int64_t {
    if (!t.defined() || t.storage() != Storage::kMapped || t.device() != Device::kCpu) return 0;
    return static_cast<int64_t>(release_pages(t.raw_data(), t.nbytes()));
  };
  int64_t released = 0;
  for (const Parameter& p : parameters_) {
    released += release(p.tensor);
    if (p.tensor.mx_scales() != nullptr) released += release(p.tensor.mx_scales()->scales);
  }
  return released;
}

Tensor ParameterLoader::record(const std::string& name, const Shape& shape, ParameterForm form, ParameterSite site,
                               Tensor loaded) {
  Parameter parameter{name, shape, form, site, ckpt_.take_reads(), loaded};
  table_.add(std::move(parameter));
  return loaded;
}

Tensor ParameterLoader::load_f32(const std::string& name, const Shape& shape, ParameterSite site) {
  (void)ckpt_.take_reads();  // reads made outside the loader belong to no parameter
  return record(name, shape, ParameterForm::kFloat32, site, ckpt_.load_f32(name, shape));
}

Tensor ParameterLoader::load_weight(const std::string& name, const Shape& shape, ParameterSite site) {
  (void)ckpt_.take_reads();
  return record(name, shape, ParameterForm::kStored, site, ckpt_.load_weight(name, shape));
}

Tensor ParameterLoader::load_raw(const std::string& name, const Shape& shape, ParameterSite site) {
  (void)ckpt_.take_reads();
  return record(name, shape, ParameterForm::kRaw, site, ckpt_.load_raw(name, shape));
}

Tensor ParameterLoader::load_mxfp4(const std::string& name, const Shape& shape, ParameterSite site) {
  (void)ckpt_.take_reads();
  return record(name, shape, ParameterForm::kMxfp4, site, ckpt_.load_mxfp4(name, shape));
}

}  // namespace r3::models
