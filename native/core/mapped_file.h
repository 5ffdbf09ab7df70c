// Read-only memory map of a file (RAII). Weights are copied out of it at load, then it is
// closed, so resident memory holds one copy of the weights, not two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace llmd {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace llmd
