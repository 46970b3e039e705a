/**
 * @file json.hpp
 * @brief A small strict JSON value, reader and writer for the scheduler's files: calibrations
 * (`gradzip_calibrate`) and plans (`gradzip_plan`).
 *
 * The reader takes RFC 8259 JSON (objects, arrays, strings with escapes, numbers, true, false,
 * null), nests at most 64 deep, and throws `invalid_argument` naming the byte offset of the
 * first thing it cannot read. A key that appears twice in one object is such a thing (RFC 8259
 * leaves its meaning open; a reader that kept either value would hide the other). Numbers are
 * doubles. Objects keep their keys in order. Lookups throw naming the missing key or the wrong
 * type: `number_at("ranks")` names the key, `at("ranks").number()` only the types. Numbers are
 * read and written with the C library's strtod and snprintf: keep the "C" numeric locale (the
 * default).
 *
 * @code
 * gradzip::schedule::json v = gradzip::schedule::json::parse(R"({"ranks": 8, "codecs": []})");
 * double ranks = v.number_at("ranks");
 * std::string text = v.dump();
 * @endcode
 */
#pragma once

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gradzip/core/error.hpp"

namespace gradzip::schedule {

class json {
 public:
  enum class kind { null, boolean, number, string, array, object };

  json() = default;
  json(double v) : kind_(kind::number), number_(v) {}  // NOLINT: numbers convert
  json(int v) : json(static_cast<double>(v)) {}
  json(std::size_t v) : json(static_cast<double>(v)) {}
  json(bool v) : kind_(kind::boolean), boolean_(v) {}
  json(std::string v) : kind_(kind::string), text_(std::move(v)) {}
  json(const char* v) : json(std::string(v)) {}
  static json array() { json j; j.kind_ = kind::array; return j; }
  static json object() { json j; j.kind_ = kind::object; return j; }

  kind type() const noexcept { return kind_; }

  /// Appends to an array.
  json& push(json v) {
    expect(kind::array, "push");
    items_.push_back(std::move(v));
    return *this;
  }
  /// Sets a key of an object (appended; keys are not checked for repeats).
  json& set(std::string key, json v) {
    expect(kind::object, "set");
    keys_.push_back(std::move(key));
    items_.push_back(std::move(v));
    return *this;
  }

  double number() const { return expect(kind::number, "number"), number_; }
  bool boolean() const { return expect(kind::boolean, "boolean"), boolean_; }
  const std::string& text() const { return expect(kind::string, "text"), text_; }
  /// An array's values.
  const std::vector<json>& items() const { return expect(kind::array, "items"), items_; }
  /// An array's values or an object's members: how many.
  std::size_t size() const {
    if (kind_ != kind::object) expect(kind::array, "size");
    return items_.size();
  }
  const json& operator[](std::size_t i) const {
    expect(kind::array, "index");
    GRADZIP_EXPECTS(i < items_.size(), "json: index ", i, " of an array of ", items_.size());
    return items_[i];
  }
  bool contains(const std::string& key) const { return find(key) != nullptr; }
  const json& at(const std::string& key) const {
    const json* v = find(key);
    GRADZIP_EXPECTS(v != nullptr, "json: no key \"", key, "\"");
    return *v;
  }
  /// The number, string, boolean or array under `key`; throws naming the key where it is absent
  /// or holds another type.
  double number_at(const std::string& key) const { return typed_at(key, kind::number).number_; }
  const std::string& text_at(const std::string& key) const { return typed_at(key, kind::string).text_; }
  bool boolean_at(const std::string& key) const { return typed_at(key, kind::boolean).boolean_; }
  const std::vector<json>& array_at(const std::string& key) const { return typed_at(key, kind::array).items_; }
  /// The number or boolean under `key`, or `fallback` when the key is absent.
  double number_or(const std::string& key, double fallback) const {
    return contains(key) ? number_at(key) : fallback;
  }
  bool boolean_or(const std::string& key, bool fallback) const {
    return contains(key) ? boolean_at(key) : fallback;
  }

  /// Compact text, numbers with 17 significant digits (they read back exactly).
  std::string dump() const {
    std::string out;
    write(out);
    return out;
  }

  static json parse(const std::string& text) {
    reader r{text, 0};
    json v = r.value(0);
    r.space();
    r.check(r.at == text.size(), "text after the value");
    return v;
  }

 private:
  static const char* kind_name(kind k) {
    static const char* const names[] = {"null", "boolean", "number", "string", "array", "object"};
    return names[static_cast<int>(k)];
  }
  static const char* article(kind k) { return k == kind::array || k == kind::object ? "an " : "a "; }
  void expect(kind k, const char* what) const {
    GRADZIP_EXPECTS(kind_ == k, "json: ", what, " needs ", article(k), kind_name(k), ", the value is ", article(kind_),
                    kind_name(kind_));
  }
  const json& typed_at(const std::string& key, kind k) const {
    const json& v = at(key);
    GRADZIP_EXPECTS(v.kind_ == k, "json: \"", key, "\" must be ", article(k), kind_name(k), ", got ", article(v.kind_),
                    kind_name(v.kind_));
    return v;
  }
  const json* find(const std::string& key) const {
    expect(kind::object, "a key lookup");
    for (std::size_t i = 0; i < keys_.size(); ++i) {
      if (keys_[i] == key) return &items_[i];
    }
    return nullptr;
  }

  static void write_string(std::string& out, const std::string& s) {
    out += '"';
    for (char c : s) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
        out += buf;
      } else {
        out += c;
      }
    }
    out += '"';
  }

  void write(std::string& out) const {
    switch (kind_) {
      case kind::null: out += "null"; return;
      case kind::boolean: out += boolean_ ? "true" : "false"; return;
      case kind::number: {
        GRADZIP_EXPECTS(std::isfinite(number_), "json: cannot write the number ", number_);
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.17g", number_);
        out += buf;
        return;
      }
      case kind::string: write_string(out, text_); return;
      case kind::array:
      case kind::object:
        out += kind_ == kind::array ? '[' : '{';
        for (std::size_t i = 0; i < items_.size(); ++i) {
          if (i != 0) out += ',';
          if (kind_ == kind::object) {
            write_string(out, keys_[i]);
            out += ':';
          }
          items_[i].write(out);
        }
        out += kind_ == kind::array ? ']' : '}';
        return;
    }
  }

  struct reader {
    const std::string& s;
    std::size_t at;

    void check(bool ok, const char* what) const {
      GRADZIP_EXPECTS(ok, "json: ", what, " at byte ", at);
    }
    void space() {
      while (at < s.size() && (s[at] == ' ' || s[at] == '\t' || s[at] == '\n' || s[at] == '\r')) ++at;
    }
    bool take(char c) {
      space();
      if (at < s.size() && s[at] == c) {
        ++at;
        return true;
      }
      return false;
    }
    void literal(const char* word) {
      for (const char* p = word; *p != '\0'; ++p, ++at) check(at < s.size() && s[at] == *p, "an unknown word");
    }
    json value(int depth) {
      check(depth < 64, "nesting deeper than 64");
      space();
      check(at < s.size(), "the end of the text where a value should be");
      const char c = s[at];
      if (c == '{') return object(depth);
      if (c == '[') return array(depth);
      if (c == '"') return json(string());
      if (c == 't') return literal("true"), json(true);
      if (c == 'f') return literal("false"), json(false);
      if (c == 'n') return literal("null"), json();
      return json(number());
    }
    json object(int depth) {
      ++at;
      json o = json::object();
      if (take('}')) return o;
      std::set<std::string> keys;  // a set, not find(): a hostile object of n keys costs n log n
      do {
        space();
        check(at < s.size() && s[at] == '"', "a key that is not a string");
        const std::size_t key_at = at;
        std::string key = string();
        GRADZIP_EXPECTS(keys.insert(key).second, "json: the key \"", key, "\" appears twice in one object, again at byte ",
                        key_at);
        check(take(':'), "a missing ':'");
        o.set(std::move(key), value(depth + 1));
      } while (take(','));
      check(take('}'), "a missing ',' or '}'");
      return o;
    }
    json array(int depth) {
      ++at;
      json a = json::array();
      if (take(']')) return a;
      do {
        a.push(value(depth + 1));
      } while (take(','));
      check(take(']'), "a missing ',' or ']'");
      return a;
    }
    unsigned hex4() {
      unsigned v = 0;
      for (int i = 0; i < 4; ++i, ++at) {
        check(at < s.size() && std::isxdigit(static_cast<unsigned char>(s[at])), "a bad \\u escape");
        const char h = s[at];
        v = v * 16 + static_cast<unsigned>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      return v;
    }
    static void utf8(std::string& out, unsigned cp) {
      if (cp < 0x80) {
        out += static_cast<char>(cp);
      } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      }
    }
    std::string string() {
      ++at;  // the opening quote
      std::string out;
      for (;;) {
        check(at < s.size(), "an unterminated string");
        const char c = s[at++];
        if (c == '"') return out;
        check(static_cast<unsigned char>(c) >= 0x20, "a control character in a string");
        if (c != '\\') {
          out += c;
          continue;
        }
        check(at < s.size(), "an unterminated escape");
        const char e = s[at++];
        switch (e) {
          case '"': case '\\': case '/': out += e; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'u': {
            unsigned cp = hex4();
            if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
              check(at + 1 < s.size() && s[at] == '\\' && s[at + 1] == 'u', "a lone surrogate");
              at += 2;
              const unsigned low = hex4();
              check(low >= 0xDC00 && low < 0xE000, "a lone surrogate");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else {
              check(cp < 0xDC00 || cp >= 0xE000, "a lone surrogate");
            }
            utf8(out, cp);
            break;
          }
          default: check(false, "an unknown escape");
        }
      }
    }
    double number() {
      const std::size_t start = at;
      if (at < s.size() && s[at] == '-') ++at;
      const auto digits = [&] {
        const std::size_t from = at;
        while (at < s.size() && s[at] >= '0' && s[at] <= '9') ++at;
        return at - from;
      };
      const std::size_t first = at;
      check(digits() > 0, "a value that is not JSON");
      check(s[first] != '0' || at - first == 1, "a number with a leading zero");
      if (at < s.size() && s[at] == '.') {
        ++at;
        check(digits() > 0, "a number without digits after '.'");
      }
      if (at < s.size() && (s[at] == 'e' || s[at] == 'E')) {
        ++at;
        if (at < s.size() && (s[at] == '+' || s[at] == '-')) ++at;
        check(digits() > 0, "a number without exponent digits");
      }
      const std::string text = s.substr(start, at - start);
      const double v = std::strtod(text.c_str(), nullptr);
      check(std::isfinite(v), "a number out of range");
      return v;
    }
  };

  kind kind_ = kind::null;
  bool boolean_ = false;
  double number_ = 0.0;
  std::string text_;
  std::vector<std::string> keys_;
  std::vector<json> items_;
};

}  // namespace gradzip::schedule
