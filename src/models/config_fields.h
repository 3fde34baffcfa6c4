// Typed access to the fields of a config.json object, every error naming the file and the field. The
// generic reader (io/model_config.cpp) and each family's configure hook (models/family.h) read
// through it, so a family's own fields are checked exactly as the shared ones are.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ingot {

struct ConfigFields {
  static constexpr int64_t kMaxInt = INT32_MAX;  // any count the runtime narrows to int

  const nlohmann::json& j;
  const std::string& src;  // the file, for errors

  std::string where(const std::string& f) const { return src + ": field '" + f + "'"; }
  bool has(const std::string& f) const { return j.contains(f) && !j[f].is_null(); }
  // A positive integer no larger than `limit` (an integer too large for int64 is reported as such).
  int64_t positive_int(const std::string& f, int64_t limit = kMaxInt) const {
    if (!has(f)) throw Error(where(f) + " is missing");
    if (!j[f].is_number_integer()) throw Error(where(f) + " must be an integer");
    if (j[f].is_number_unsigned() && j[f].get<uint64_t>() > uint64_t(limit))
      throw Error(where(f) + " is " + std::to_string(j[f].get<uint64_t>()) + ", above the limit of " +
                  std::to_string(limit) + limit_reason(limit));
    int64_t v = j[f].get<int64_t>();
    if (v <= 0) throw Error(where(f) + " must be positive, got " + std::to_string(v));
    if (v > limit)
      throw Error(where(f) + " is " + std::to_string(v) + ", above the limit of " + std::to_string(limit) +
                  limit_reason(limit));
    return v;
  }
  static std::string limit_reason(int64_t limit) {
    return limit == kMaxInt ? "" : " (no real model comes near it: the config is corrupt or mistyped)";
  }
  int64_t nonnegative_int(const std::string& f) const {
    if (!j[f].is_number_integer() || j[f].get<int64_t>() < 0 ||
        (j[f].is_number_unsigned() && j[f].get<uint64_t>() > uint64_t(kMaxInt)))
      throw Error(where(f) + " must be a non-negative integer no larger than " + std::to_string(kMaxInt));
    return j[f].get<int64_t>();
  }
  int64_t positive_int_or(const std::string& f, int64_t def, int64_t limit = kMaxInt) const {
    return has(f) ? positive_int(f, limit) : def;
  }
  // JSON has no NaN or infinity, but a literal like 1e999 parses as infinity.
  double number_or(const std::string& f, double def) const {
    if (!has(f)) return def;
    if (!j[f].is_number()) throw Error(where(f) + " must be a number");
    const double v = j[f].get<double>();
    if (!std::isfinite(v)) throw Error(where(f) + " must be a finite number");
    return v;
  }
  bool bool_or(const std::string& f, bool def) const {
    if (!has(f)) return def;
    if (!j[f].is_boolean()) throw Error(where(f) + " must be true or false");
    return j[f].get<bool>();
  }
};

}  // namespace ingot
