#pragma once
// A YAML manifest (deploy/'s) as the API server holds it once applied, for tests that store one in
// the fake API server: quoted scalars stay strings, plain ones that read as whole numbers or
// booleans become them. (The includer links yaml-cpp.)

#include <nlohmann/json.hpp>
#include <string>

#include "yaml-cpp/yaml.h"

namespace tessera::fakes {

inline nlohmann::json JsonOfYaml(const YAML::Node& n) {
  if (n.IsMap()) {
    nlohmann::json o = nlohmann::json::object();
    for (const auto& kv : n) o[kv.first.as<std::string>()] = JsonOfYaml(kv.second);
    return o;
  }
  if (n.IsSequence()) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& v : n) a.push_back(JsonOfYaml(v));
    return a;
  }
  if (n.IsNull()) return nullptr;
  const std::string s = n.as<std::string>();
  if (n.Tag() == "!") return s;
  if (s == "true" || s == "false") return s == "true";
  if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos) return std::stoll(s);
  return s;
}

}  // namespace tessera::fakes
