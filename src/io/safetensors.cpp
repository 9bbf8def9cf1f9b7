#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "io/json_file.h"

namespace r3 {

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the format's own limit

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& j) {
  auto bad = [&](const std::string& what) {
    R3_FAIL(path, ": tensor '", brief(name), "': ", what);
  };
  if (!j.is_object()) bad("header entry is not an object");
  if (!j.contains("dtype") || !j["dtype"].is_string()) bad("missing string 'dtype'");
  if (!j.contains("shape") || !j["shape"].is_array()) bad("missing array 'shape'");
  if (!j.contains("data_offsets") || !j["data_offsets"].is_array() || j["data_offsets"].size() != 2)
    bad("missing 'data_offsets' [begin, end]");

  SafetensorsEntry e;
  e.name = name;
  try {
    e.dtype = dtype_from_name(j["dtype"].get<std::string>());
  } catch (const Error& err) {
    bad(err.what());
  }
  for (const json& d : j["shape"]) {
    if (!d.is_number_unsigned()) bad("shape has a non-integer or negative dimension");
    const uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      bad(detail::concat("shape dimension ", dim, " is out of range"));
    }
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  // Bytes the shape needs, in any dtype: an overflow anywhere (element count or bytes) refuses the
  // tensor, so numel() and nbytes() of its view can never wrap.
  uint64_t expected = dtype_size(e.dtype);
  bool overflow = false;
  for (int64_t dim : e.shape) overflow = overflow || __builtin_mul_overflow(expected, static_cast<uint64_t>(dim), &expected);
  if (overflow || expected > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    bad(detail::concat("shape ", shape_to_string(e.shape), " of ", dtype_name(e.dtype), " is too large"));
  }
  for (const json& o : j["data_offsets"]) {
    if (!o.is_number_unsigned()) bad("data_offsets must be non-negative integers");
  }
  e.begin = j["data_offsets"][0].get<uint64_t>();
  e.end = j["data_offsets"][1].get<uint64_t>();
  if (e.end < e.begin) bad("data_offsets end before begin");
  if (e.end - e.begin != expected) {
    bad(detail::concat("data_offsets span ", e.end - e.begin, " bytes but ", dtype_name(e.dtype),
                       " ", shape_to_string(e.shape), " needs ", expected));
  }
  return e;
}

}  // namespace

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile(std::make_unique<MappedFile>(path)));
  f->parse();
  return f;
}

SafetensorsFile::SafetensorsFile(std::unique_ptr<MappedFile> file) : file_(std::move(file)) {}

void SafetensorsFile::parse() {
  const std::string& p = file_->path();
  const std::size_t size = file_->size();
  R3_CHECK(size >= 8, p, ": not a safetensors file (", size, " bytes, shorter than the 8-byte header length)");
  const uint64_t header_len = read_u64_le(file_->data());
  R3_CHECK(header_len <= kMaxHeaderBytes, p, ": header length ", header_len, " exceeds the format limit");
  R3_CHECK(header_len <= size - 8, p, ": truncated file: header claims ", header_len,
           " bytes, only ", size - 8, " follow");
  const char* header = reinterpret_cast<const char*>(file_->data() + 8);
  // Duplicate names are refused while parsing (a JSON object would keep only the last).
  const json j = parse_json(std::string_view(header, header_len), p + ": header", {.unique_keys = true});
  R3_CHECK(j.is_object(), p, ": header is not a JSON object");

  data_section_ = file_->data() + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      R3_CHECK(it.value().is_object(), p, ": __metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        R3_CHECK(m.value().is_string(), p, ": __metadata__ value '", brief(m.key()), "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    SafetensorsEntry e = parse_entry(p, it.key(), it.value());
    R3_CHECK(e.end <= data_size, p, ": truncated file: tensor '", brief(e.name), "' ends at byte ", e.end,
             " of a data section of ", data_size, " bytes");
    entries_[e.name] = std::move(e);
  }
  // The data section starts right after the header and the tensors tile it exactly: no gap (the
  // format forbids them), no overlap, nothing after the last one. A header length that is off by
  // a byte shifts the data section, and this is where it shows.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& [name, e] : entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const SafetensorsEntry* last = nullptr;
  for (const SafetensorsEntry* e : by_offset) {
    R3_CHECK(e->begin <= covered, p, ": bytes [", covered, ", ", e->begin,
             ") of the data section belong to no tensor (before tensor '", brief(e->name), "')");
    R3_CHECK(e->begin == covered, p, ": tensors '", brief(last->name), "' and '", brief(e->name), "' overlap");
    covered = e->end;
    if (e->end > e->begin) last = e;
  }
  R3_CHECK(covered == data_size, p, ": data section is ", data_size, " bytes but the tensors cover ", covered,
           " (is the header length right?)");
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

Tensor SafetensorsFile::view(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  R3_CHECK(e != nullptr, path(), ": no tensor named '", name, "'");
  auto* bytes = const_cast<uint8_t*>(data_section_ + e->begin);
  return Tensor::view(e->dtype, e->shape, bytes, file_, Storage::kMapped);
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<const NamedTensor*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });

  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const NamedTensor* t : sorted) {
    R3_CHECK(t->tensor.is_contiguous(), "write_safetensors: '", t->name, "' is not contiguous");
    R3_CHECK(t->name != "__metadata__", "write_safetensors: reserved tensor name");
    uint64_t n = t->tensor.nbytes();
    header[t->name] = {{"dtype", std::string(dtype_name(t->tensor.dtype()))},
                       {"shape", t->tensor.shape()},
                       {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data section is 8-byte aligned

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  R3_CHECK(out.good(), "cannot write ", path, ": ", std::strerror(errno));
  uint64_t len = text.size();
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(len >> (8 * i));
  out.write(reinterpret_cast<const char*>(len_bytes), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const NamedTensor* t : sorted) {
    out.write(static_cast<const char*>(t->tensor.raw_data()),
              static_cast<std::streamsize>(t->tensor.nbytes()));
  }
  out.close();
  R3_CHECK(out.good(), "failed writing ", path);
}

}  // namespace r3
