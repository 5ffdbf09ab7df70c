#include "gguf_file.h"

#include <cstring>
#include <stdexcept>

namespace llmd {

namespace {

enum GgufValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  template <typename T>
  T read() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string() {
    const uint64_t n = read<uint64_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

  size_t pos() const { return pos_; }

 private:
  void need(size_t n) const {
    if (pos_ + n > size_) throw std::runtime_error(path_ + ": truncated GGUF header");
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

int64_t read_int_scalar(Cursor& c, uint32_t t) {
  switch (t) {
    case kU8: return c.read<uint8_t>();
    case kI8: return c.read<int8_t>();
    case kU16: return c.read<uint16_t>();
    case kI16: return c.read<int16_t>();
    case kU32: return c.read<uint32_t>();
    case kI32: return c.read<int32_t>();
    case kU64: return static_cast<int64_t>(c.read<uint64_t>());
    case kI64: return c.read<int64_t>();
    case kBool: return c.read<uint8_t>() != 0;
  }
  throw std::runtime_error("not an integer GGUF type");
}

bool is_int_type(uint32_t t) {
  return t == kU8 || t == kI8 || t == kU16 || t == kI16 || t == kU32 || t == kI32 ||
         t == kU64 || t == kI64;
}

MetaValue read_value(Cursor& c, uint32_t t) {
  if (is_int_type(t)) return read_int_scalar(c, t);
  switch (t) {
    case kBool: return c.read<uint8_t>() != 0;
    case kF32: return static_cast<double>(c.read<float>());
    case kF64: return c.read<double>();
    case kString: return c.read_string();
    case kArray: {
      const uint32_t et = c.read<uint32_t>();
      const uint64_t n = c.read<uint64_t>();
      if (et == kString) {
        std::vector<std::string> v;
        v.reserve(n);
        for (uint64_t i = 0; i < n; ++i) v.push_back(c.read_string());
        return v;
      }
      if (et == kF32 || et == kF64) {
        std::vector<double> v;
        v.reserve(n);
        for (uint64_t i = 0; i < n; ++i) v.push_back(et == kF32 ? c.read<float>() : c.read<double>());
        return v;
      }
      std::vector<int64_t> v;
      v.reserve(n);
      for (uint64_t i = 0; i < n; ++i) v.push_back(read_int_scalar(c, et == kBool ? kU8 : et));
      return v;
    }
  }
  throw std::runtime_error("unknown GGUF value type " + std::to_string(t));
}

}  // namespace

int64_t TensorView::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

GgufFile::GgufFile(const std::string& path) : file_(std::make_unique<MappedFile>(path)) {
  Cursor c(file_->data(), file_->size(), path);
  if (file_->size() < 4 || std::memcmp(file_->data(), "GGUF", 4) != 0) {
    throw std::runtime_error(path + " is not a GGUF file (bad magic)");
  }
  c.read<uint32_t>();
  const uint32_t version = c.read<uint32_t>();
  if (version < 2 || version > 3) {
    throw std::runtime_error(path + ": unsupported GGUF version " + std::to_string(version));
  }
  const uint64_t n_tensors = c.read<uint64_t>();
  const uint64_t n_kv = c.read<uint64_t>();
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string();
    const uint32_t t = c.read<uint32_t>();
    metadata_.set(key, read_value(c, t));
  }
  struct Info {
    std::string name;
    TensorType type;
    std::vector<int64_t> shape;
    uint64_t offset;
  };
  std::vector<Info> infos;
  infos.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    Info info;
    info.name = c.read_string();
    const uint32_t n_dims = c.read<uint32_t>();
    for (uint32_t d = 0; d < n_dims; ++d) info.shape.push_back(static_cast<int64_t>(c.read<uint64_t>()));
    info.type = static_cast<TensorType>(c.read<uint32_t>());
    info.offset = c.read<uint64_t>();
    infos.push_back(std::move(info));
  }
  const uint64_t alignment = metadata_.get_int("general.alignment").value_or(32);
  const size_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  for (auto& info : infos) {
    int64_t n = 1;
    for (int64_t d : info.shape) n *= d;
    const BlockLayout layout = block_layout(info.type);
    const size_t n_bytes = static_cast<size_t>(n / layout.elements) * layout.bytes;
    if (data_start + info.offset + n_bytes > file_->size()) {
      throw std::runtime_error(path + ": tensor " + info.name + " runs past the end of the file");
    }
    TensorView view{info.name, info.type, info.shape, file_->data() + data_start + info.offset, n_bytes};
    tensors_.emplace(info.name, std::move(view));
  }
}

const TensorView& GgufFile::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw std::runtime_error("model file has no tensor '" + name + "'");
  return it->second;
}

const TensorView* GgufFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace llmd
