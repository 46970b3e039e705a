// A codec spec string, parsed: "topk(ratio=0.01)+qsgd(bits=4,seed=7)+coo".
//
// spec  := stage ('+' stage)*
// stage := name ['(' arg (',' arg)* ')']
// arg   := key '=' number
//
// Stages are named after gradzip's headers (docs/pytorch.md lists them). Every error names the
// spec, the stage and the offending text, so a typo is found from the message alone.
#pragma once

#include <gradzip/core/error.hpp>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace gradzip_py {

struct stage {
  std::string name;
  std::map<std::string, std::string> args;  // key -> number as written
};

struct parsed_spec {
  std::string text;
  std::vector<stage> stages;
};

inline std::string trim(const std::string& s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

inline bool is_name(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

inline stage parse_stage(const std::string& text, const std::string& spec) {
  stage st;
  const std::size_t open = text.find('(');
  st.name = trim(text.substr(0, open));
  GRADZIP_EXPECTS(is_name(st.name), "codec spec '", spec, "': '", text, "' is not a stage name");
  if (open == std::string::npos) return st;
  GRADZIP_EXPECTS(text.back() == ')', "codec spec '", spec, "': stage '", text, "' lacks its closing ')'");
  const std::string inside = text.substr(open + 1, text.size() - open - 2);
  std::size_t at = 0;
  while (at <= inside.size() && !trim(inside).empty()) {
    const std::size_t comma = inside.find(',', at);
    const std::string arg = trim(inside.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    const std::size_t eq = arg.find('=');
    GRADZIP_EXPECTS(eq != std::string::npos, "codec spec '", spec, "': argument '", arg, "' of stage '", st.name,
                    "' must be key=value");
    const std::string key = trim(arg.substr(0, eq)), value = trim(arg.substr(eq + 1));
    GRADZIP_EXPECTS(is_name(key) && !value.empty(), "codec spec '", spec, "': argument '", arg, "' of stage '",
                    st.name, "' must be key=value");
    GRADZIP_EXPECTS(st.args.emplace(key, value).second, "codec spec '", spec, "': stage '", st.name,
                    "' sets '", key, "' twice");
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return st;
}

inline parsed_spec parse_spec(const std::string& spec) {
  parsed_spec out{spec, {}};
  GRADZIP_EXPECTS(!trim(spec).empty(), "codec spec is empty");
  std::size_t at = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= spec.size(); ++i) {
    if (i < spec.size() && spec[i] == '(') ++depth;
    if (i < spec.size() && spec[i] == ')') --depth;
    GRADZIP_EXPECTS(depth >= 0 && depth <= 1, "codec spec '", spec, "': unbalanced parentheses");
    if (i == spec.size() || (spec[i] == '+' && depth == 0)) {
      out.stages.push_back(parse_stage(trim(spec.substr(at, i - at)), spec));
      at = i + 1;
    }
  }
  GRADZIP_EXPECTS(depth == 0, "codec spec '", spec, "': unbalanced parentheses");
  return out;
}

/// Reads a stage's arguments, each at most once; `finish` refuses any left unread.
class arguments {
 public:
  arguments(const stage& st, const std::string& spec) : st_(st), spec_(spec) {}

  double number(const std::string& key, double fallback) { return has(key) ? parse(key) : fallback; }
  double required(const std::string& key) {
    GRADZIP_EXPECTS(has(key), "codec spec '", spec_, "': stage '", st_.name, "' needs ", key, "=");
    return parse(key);
  }
  std::uint64_t integer(const std::string& key, std::uint64_t fallback) {
    if (!has(key)) return fallback;
    read_.insert(key);
    // Integers are read as integers (seeds use all 64 bits), without the locale.
    const std::string& text = st_.args.at(key);
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    GRADZIP_EXPECTS(ec == std::errc() && end == text.data() + text.size(), "codec spec '", spec_, "': stage '",
                    st_.name, "': ", key, " must be a non-negative integer below 2^64, got ", text);
    return v;
  }
  bool flag(const std::string& key, bool fallback) {
    if (!has(key)) return fallback;
    const double v = parse(key);
    GRADZIP_EXPECTS(v == 0 || v == 1, "codec spec '", spec_, "': stage '", st_.name, "': ", key,
                    " must be 0 or 1, got ", st_.args.at(key));
    return v == 1;
  }
  bool has(const std::string& key) const { return st_.args.count(key) != 0; }
  void finish() const {
    for (const auto& [key, value] : st_.args) {
      GRADZIP_EXPECTS(read_.count(key) != 0, "codec spec '", spec_, "': stage '", st_.name,
                      "' has no parameter '", key, "'");
    }
  }

 private:
  double parse(const std::string& key) {
    read_.insert(key);
    const std::string& text = st_.args.at(key);
    double v = 0.0;  // from_chars: the C locale whatever LC_NUMERIC says
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    GRADZIP_EXPECTS(ec == std::errc() && end == text.data() + text.size() && std::isfinite(v), "codec spec '", spec_,
                    "': stage '", st_.name, "': ", key, "=", text, " is not a finite number");
    return v;
  }

  const stage& st_;
  const std::string& spec_;
  std::set<std::string> read_;
};

}  // namespace gradzip_py
