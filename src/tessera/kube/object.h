#pragma once
// Reading fields of Kubernetes objects as the API server sends them (nlohmann::json), where any
// field may be missing or of the wrong type: a missing or mistyped field reads as absent. Pure
// functions.

#include <initializer_list>
#include <string>

#include "nlohmann/json.hpp"

namespace tessera::kube {

// The value at `path` ({"metadata", "labels", "app"}); nullptr when a step is missing or not an
// object.
inline const nlohmann::json* FieldAt(const nlohmann::json& object,
                                     std::initializer_list<const char*> path) {
  const nlohmann::json* cur = &object;
  for (const char* key : path) {
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(key);
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur;
}

// The string at `path`; empty when missing or not a string.
inline std::string StringAt(const nlohmann::json& object, std::initializer_list<const char*> path) {
  const nlohmann::json* v = FieldAt(object, path);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

}  // namespace tessera::kube
