#include "core/json.h"

#include <charconv>
#include <cmath>
#include <system_error>

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
      // JSON's number grammar only (no nan, inf or hex), read without the C locale's decimal point
      const char* start = t_.c_str() + i_;
      const char* last = t_.c_str() + t_.size();
      if (!(c == '-' || (c >= '0' && c <= '9'))) fail("expected a value");
      const auto [end, ec] = std::from_chars(start, last, v.num, std::chars_format::general);
      if (ec != std::errc() || end == start) fail("a malformed number");
      v.kind = Json::Kind::number;
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
            unsigned code = 0;
            const auto [end, ec] = std::from_chars(t_.data() + i_, t_.data() + i_ + 4, code, 16);
            if (ec != std::errc() || end != t_.data() + i_ + 4) fail("a bad \\u escape");
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

long long Json::natural(long long most) const {
  const long long v = integer();
  if (v < 0 || v > most) wrong("a count out of range: " + std::to_string(v));
  return v;
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
