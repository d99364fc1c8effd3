// A small JSON reader: the one wire format of a plan (hocc.plan.types.Plan.to_json, read by
// plan_from_json) for the bindings and the sanitizer alike. Numbers are doubles (a plan's counts are
// far below 2^53); objects keep their keys sorted; anything malformed throws hocc::Error.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hocc {

struct Json {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  const Json& at(const std::string& key) const;  // a field that must be there
  const Json* find(const std::string& key) const;  // nullptr where absent
  long long integer() const;                        // a number that must be a whole one
  long long natural(long long most) const;          // a whole number in [0, most]
  const std::string& text() const;
  bool boolean() const;
  const std::vector<Json>& array() const;
};

Json parse_json(const std::string& text);

}  // namespace hocc
