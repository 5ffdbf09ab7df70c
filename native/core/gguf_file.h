// GGUF container reader: header metadata and tensor directory over a memory-mapped file.
// The format is simple and stable (magic, version, key/values, tensor infos, aligned data);
// reading it here keeps the worker's load path in one language and lets weights stay in
// their quantized blocks without any conversion.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mapped_file.h"
#include "metadata.h"
#include "tensor_types.h"

namespace llmd {

struct TensorView {
  std::string name;
  TensorType type;
  std::vector<int64_t> shape;  // GGUF order: shape[0] is the contiguous (row) dimension
  const uint8_t* data;
  size_t n_bytes;
  int64_t n_elements() const;
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);

  const Metadata& metadata() const { return metadata_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const TensorView& tensor(const std::string& name) const;
  const TensorView* find(const std::string& name) const;
  size_t file_size() const { return file_->size(); }

 private:
  std::unique_ptr<MappedFile> file_;
  Metadata metadata_;
  std::map<std::string, TensorView> tensors_;
};

}  // namespace llmd
