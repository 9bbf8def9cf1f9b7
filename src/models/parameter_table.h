// The parameter table: every weight a model holds, by the checkpoint tensor it came from.
//
// A family's builder loads each weight through a ParameterLoader, which reads it from the
// checkpoint and records it here: its checkpoint name, the shape the model declares, the form it
// is kept in, where in the model it sits (layer, expert), the stored tensors it read (an FP8
// weight's block scales, MXFP4 blocks and scales) and the tensor the model was given (sharing its
// memory). So the table is the one list of what a model is made of: placing a model on a device
// and updating its weights in place walk it, and a name that is not in it is refused by name.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/checkpoint.h"

namespace r3::models {

// How a checkpoint tensor is kept by the model.
enum class ParameterForm {
  kFloat32,  // widened to float32 (norms, biases, router gates, tables read element by element)
  kStored,   // a projection matrix as stored: F32, BF16, F16, or FP8 with its block scales
  kMxfp4,    // an MXFP4 stack (its `_blocks` and `_scales`), as one F4 matrix with its scales
  kRaw,      // the stored dtype, copied (integer tables)
};
const char* parameter_form_name(ParameterForm form);

// Where a parameter sits in the model: a layer index (-1: outside the layers, such as the
// embedding) and an expert index (-1: not one expert's).
struct ParameterSite {
  int64_t layer = -1;
  int64_t expert = -1;
};

struct Parameter {
  std::string name;  // the checkpoint's name (for an MXFP4 stack, the name its parts extend)
  Shape shape;       // as the model declares it (for MXFP4, in values)
  ParameterForm form = ParameterForm::kFloat32;
  ParameterSite site;
  std::vector<std::string> stored;  // the checkpoint tensors it was read from
  Tensor tensor;                    // what the builder was given (the model's memory)
};

class ParameterTable {
 public:
  // Records a parameter. Throws, naming it, when a parameter of that name or one reading any of
  // the same stored tensors is already recorded (each checkpoint tensor feeds one parameter).
  void add(Parameter parameter);

  const std::vector<Parameter>& parameters() const { return parameters_; }
  std::size_t size() const { return parameters_.size(); }
  // The parameter that reads the checkpoint tensor `stored_name` (a parameter's name, or one of
  // its block scales, blocks or scales), or null.
  const Parameter* find(const std::string& stored_name) const;
  // The same; throws naming `stored_name` when no parameter reads it ("unknown tensor").
  const Parameter& at(const std::string& stored_name) const;
  // Every checkpoint tensor some parameter reads, sorted.
  std::vector<std::string> stored_names() const;
  // The parameter `name` now lives in `tensor` (the builder copied it there, e.g. into rows of a
  // matrix it stacked it with): the same dtype and element count, so that the table names the
  // memory the model reads. Throws naming it otherwise, or when no parameter has that name.
  void relocate(const std::string& name, Tensor tensor);
  // Drops the process's resident pages of every parameter held as a view of the checkpoint's
  // mapping (a model placed on a device has copied them there): the host keeps no second copy.
  // A page touched again is read back from the file. Returns the bytes released.
  int64_t release_mapped_pages() const;

 private:
  std::vector<Parameter> parameters_;
  std::map<std::string, std::size_t> by_stored_;  // stored name -> index in parameters_
};

// Reads weights from a checkpoint for a builder, recording each in `table`. The same loads as
// Checkpoint's (their errors name the checkpoint tensor, its expected and found shape), each
// with the site the builder loads it for.
class ParameterLoader {
 public:
  ParameterLoader(const Checkpoint& checkpoint, ParameterTable& table) : ckpt_(checkpoint), table_(table) {}

  const Checkpoint& checkpoint() const { return ckpt_; }
  const std::string& dir() const { return ckpt_.dir(); }
  bool contains(const std::string& name) const { return ckpt_.contains(name); }
  bool stores_mxfp4(const std::string& name) const { return ckpt_.stores_mxfp4(name); }

  Tensor load_f32(const std::string& name, const Shape& shape, ParameterSite site = {});
  Tensor load_weight(const std::string& name, const Shape& shape, ParameterSite site = {});
  Tensor load_raw(const std::string& name, const Shape& shape, ParameterSite site = {});
  Tensor load_mxfp4(const std::string& name, const Shape& shape, ParameterSite site = {});
  // ParameterTable::relocate.
  void relocate(const std::string& name, Tensor tensor) { table_.relocate(name, std::move(tensor)); }

 private:
  Tensor record(const std::string& name, const Shape& shape, ParameterForm form, ParameterSite site, Tensor loaded);

  const Checkpoint& ckpt_;
  ParameterTable& table_;
};

}  // namespace r3::models
