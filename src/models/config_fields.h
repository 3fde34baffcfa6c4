// Typed access to the fields of a config.json object, every error naming the file and the field. The
// generic reader (io/model_config.cpp) and each family's configure hook (models/family.h) read
// through it, so a family's own fields are checked exactly as the shared ones are.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ingot {

struct ConfigFields {
  const nlohmann::json& j;
  const std::string& src;  // the file, for errors

  std::string where(const std::string& f) const { return src + ": field '" + f + "'"; }
  bool has(const std::string& f) const { return j.contains(f) && !j[f].is_null(); }
  int64_t positive_int(const std::string& f) const {
    if (!has(f)) throw Error(where(f) + " is missing");
    if (!j[f].is_number_integer()) throw Error(where(f) + " must be an integer");
    int64_t v = j[f].get<int64_t>();
    if (v <= 0) throw Error(where(f) + " must be positive, got " + std::to_string(v));
    return v;
  }
  int64_t nonnegative_int(const std::string& f) const {
    if (!j[f].is_number_integer() || j[f].get<int64_t>() < 0) throw Error(where(f) + " must be a non-negative integer");
    return j[f].get<int64_t>();
  }
  int64_t positive_int_or(const std::string& f, int64_t def) const { return has(f) ? positive_int(f) : def; }
  double number_or(const std::string& f, double def) const {
    if (!has(f)) return def;
    if (!j[f].is_number()) throw Error(where(f) + " must be a number");
    return j[f].get<double>();
  }
  bool bool_or(const std::string& f, bool def) const {
    if (!has(f)) return def;
    if (!j[f].is_boolean()) throw Error(where(f) + " must be true or false");
    return j[f].get<bool>();
  }
};

}  // namespace ingot
