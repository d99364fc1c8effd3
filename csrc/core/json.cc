#include "core/json.h"

#include <cmath>
#include <cstdlib>

#include "core/types.h"

namespace hocc {

namespace {

class Reader {
 public:
  explicit Reader(const std::string& t) : t_(t) {}

  Json document() {
    Json v = value();
    space();
    if (i_ != t_.size()) fail("text after the value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw Error("hocc: bad plan JSON at byte " + std::to_string(i_) + ": " + why);
  }
  void space() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\t' || t_[i_] == '\r')) ++i_;
  }
  bool take(char c) {
    space();
    if (i_ < t_.size() && t_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(std::string("expected '") + c + "'");
  }
  bool word(const char* w) {
    const std::string s(w);
    if (t_.compare(i_, s.size(), s) != 0) return false;
    i_ += s.size();
    return true;
  }

  Json value() {
    if (++depth_ > 64) fail("nested too deep");
    space();
    if (i_ >= t_.size()) fail("unexpected end");
    Json v;
    const char c = t_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Json::Kind::object;
      if (!take('}')) {
        do {
          space();
          std::string key = string();
          expect(':');
          v.fields[key] = value();
        } while (take(','));
        expect('}');
      }
    } else if (c == '[') {
      ++i_;
      v.kind = Json::Kind::array;
      if (!take(']')) {
        do v.items.push_back(value());
        while (take(','));
        expect(']');
      }
    } else if (c == '"') {
      v.kind = Json::Kind::string;
      v.str = string();
    } else if (word("true")) {
      v.kind = Json::Kind::boolean;
      v.b = true;
    } else if (word("false")) {
      v.kind = Json::Kind::boolean;
    } else if (word("null")) {
      v.kind = Json::Kind::null;
    } else {
      v.kind = Json::Kind::number;
      const char* start = t_.c_str() + i_;
      char* end = nullptr;
      v.num = std::strtod(start, &end);
      if (end == start) fail("expected a value");
      i_ += size_t(end - start);
    }
    --depth_;
    return v;
  }

  std::string string() {
    if (i_ >= t_.size() || t_[i_] != '"') fail("expected a string");
    ++i_;
    std::string out;
    while (i_ < t_.size() && t_[i_] != '"') {
      char c = t_[i_++];
      if (c == '\\') {
        if (i_ >= t_.size()) break;
        const char e = t_[i_++];
        switch (e) {
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'r': c = '\r'; break;
          case 'b': c = '\b'; break;
          case 'f': c = '\f'; break;
          case 'u': {  // a plan's text is ASCII; any other code point is kept as '?'
            if (i_ + 4 > t_.size()) fail("a short \\u escape");
            const long code = std::strtol(t_.substr(i_, 4).c_str(), nullptr, 16);
            i_ += 4;
            c = code < 0x80 ? char(code) : '?';
            break;
          }
          default: c = e;  // \" \\ \/
        }
      }
      out += c;
    }
    if (i_ >= t_.size()) fail("an unterminated string");
    ++i_;
    return out;
  }

  const std::string& t_;
  size_t i_ = 0;
  int depth_ = 0;
};

[[noreturn]] void wrong(const std::string& what) { throw Error("hocc: bad plan JSON: " + what); }

}  // namespace

const Json* Json::find(const std::string& key) const {
  if (kind != Kind::object) wrong("expected an object");
  auto it = fields.find(key);
  return it == fields.end() ? nullptr : &it->second;
}

const Json& Json::at(const std::string& key) const {
  const Json* v = find(key);
  if (!v) wrong("no '" + key + "'");
  return *v;
}

long long Json::integer() const {
  if (kind != Kind::number || num != std::floor(num) || std::fabs(num) > 9.0e15) wrong("expected a whole number");
  return static_cast<long long>(num);
}

const std::string& Json::text() const {
  if (kind != Kind::string) wrong("expected a string");
  return str;
}

bool Json::boolean() const {
  if (kind != Kind::boolean) wrong("expected true or false");
  return b;
}

const std::vector<Json>& Json::array() const {
  if (kind != Kind::array) wrong("expected an array");
  return items;
}

Json parse_json(const std::string& text) { return Reader(text).document(); }

}  // namespace hocc
