// Architecture registry: maps a checkpoint's architecture name to its loader. Adding an
// architecture is one file plus one line here.
#include <filesystem>
#include <functional>
#include <map>
#include <stdexcept>

#include "../core/gguf_file.h"
#include "../core/model.h"
#include "llama.h"

namespace llmd {

namespace {
using GgufLoader = std::function<std::unique_ptr<Model>(const GgufFile&, const LoadOptions&)>;
using HfLoader = std::function<std::unique_ptr<Model>(const std::string&, const Metadata&, const LoadOptions&)>;

const std::map<std::string, GgufLoader>& gguf_loaders() {
  static const std::map<std::string, GgufLoader> loaders{{"llama", load_llama_gguf}};
  return loaders;
}

const std::map<std::string, HfLoader>& hf_loaders() {
  static const std::map<std::string, HfLoader> loaders{{"llama", load_llama_safetensors}};
  return loaders;
}

std::string known(const auto& loaders) {
  std::string s;
  for (const auto& [name, _] : loaders) s += (s.empty() ? "" : ", ") + name;
  return s;
}
}  // namespace

std::unique_ptr<Model> load_model(const std::string& path, const LoadOptions& options,
                                  const Metadata& hf_config) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    const std::string type = hf_config.get_string("model_type").value_or("");
    auto it = hf_loaders().find(type);
    if (it == hf_loaders().end()) {
      throw std::runtime_error("architecture '" + type + "' is not supported (supported: " + known(hf_loaders()) + ")");
    }
    return it->second(path, hf_config, options);
  }
  GgufFile file(path);
  const std::string arch = file.metadata().get_string("general.architecture").value_or("");
  auto it = gguf_loaders().find(arch);
  if (it == gguf_loaders().end()) {
    throw std::runtime_error("architecture '" + arch + "' is not supported (supported: " + known(gguf_loaders()) + ")");
  }
  return it->second(file, options);
}

}  // namespace llmd
