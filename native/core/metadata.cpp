#include "metadata.h"

namespace llmd {

std::optional<int64_t> Metadata::get_int(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  if (auto p = std::get_if<int64_t>(&it->second)) return *p;
  if (auto p = std::get_if<double>(&it->second)) return static_cast<int64_t>(*p);
  if (auto p = std::get_if<bool>(&it->second)) return *p ? 1 : 0;
  return std::nullopt;
}

std::optional<double> Metadata::get_float(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  if (auto p = std::get_if<double>(&it->second)) return *p;
  if (auto p = std::get_if<int64_t>(&it->second)) return static_cast<double>(*p);
  return std::nullopt;
}

std::optional<std::string> Metadata::get_string(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  if (auto p = std::get_if<std::string>(&it->second)) return *p;
  return std::nullopt;
}

std::optional<bool> Metadata::get_bool(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  if (auto p = std::get_if<bool>(&it->second)) return *p;
  if (auto p = std::get_if<int64_t>(&it->second)) return *p != 0;
  return std::nullopt;
}

int64_t Metadata::require_int(const std::string& key) const {
  auto v = get_int(key);
  if (!v) throw std::runtime_error("model metadata is missing integer key '" + key + "'");
  return *v;
}

double Metadata::require_float(const std::string& key) const {
  auto v = get_float(key);
  if (!v) throw std::runtime_error("model metadata is missing number key '" + key + "'");
  return *v;
}

}  // namespace llmd
