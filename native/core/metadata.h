// Model metadata as key -> value, filled from a GGUF header or a Hugging Face config.json.
// Architecture files read hyperparameters from it through the typed getters.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace llmd {

using MetaValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>,
                               std::vector<double>, std::vector<std::string>>;

class Metadata {
 public:
  void set(const std::string& key, MetaValue value) { values_[key] = std::move(value); }
  bool has(const std::string& key) const { return values_.count(key) != 0; }

  std::optional<int64_t> get_int(const std::string& key) const;
  std::optional<double> get_float(const std::string& key) const;
  std::optional<std::string> get_string(const std::string& key) const;
  std::optional<bool> get_bool(const std::string& key) const;

  int64_t require_int(const std::string& key) const;
  double require_float(const std::string& key) const;

  const std::map<std::string, MetaValue>& values() const { return values_; }

 private:
  std::map<std::string, MetaValue> values_;
};

}  // namespace llmd
