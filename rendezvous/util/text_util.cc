#include "rendezvous/util/text_util.h"

#include <unistd.h>

#include <array>
#include <cctype>
#include <charconv>
#include <utility>

namespace ddprun {

std::string env_or(const std::map<std::string, std::string>& env, const std::string& name,
                   const std::string& fallback) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? fallback : it->second;
}

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    auto pos = text.find(sep, start);
    out.emplace_back(
        text.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) return out;
    start = pos + 1;
  }
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += sep;
    out += parts[i];
  }
  return out;
}

std::string mib_text(uint64_t bytes) {
  return std::to_string(bytes >> 20) + " MiB";
}

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\n") - b + 1);
}

std::optional<long long> parse_int(std::string_view text) {
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  if (text.empty() || text[0] == '+') return std::nullopt;
  long long v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<uint64_t> parse_uint(std::string_view text) {
  if (text.empty() || text[0] < '0' || text[0] > '9') return std::nullopt;
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<uint64_t> parse_byte_size(std::string_view text) {
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end == text.data()) return std::nullopt;
  std::string unit;
  for (const char* p = end; p != text.data() + text.size(); ++p) {
    unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(*p))));
  }
  static constexpr std::array<std::pair<std::string_view, int>, 7> kUnits = {
      {{"", 0}, {"k", 10}, {"kib", 10}, {"m", 20}, {"mib", 20}, {"g", 30}, {"gib", 30}}};
  for (const auto& [name, shift] : kUnits) {
    if (unit != name) continue;
    if (shift > 0 && n > (UINT64_MAX >> shift)) return std::nullopt;
    return n << shift;
  }
  return std::nullopt;
}

std::string template_substitute(std::string_view text, const std::map<std::string, std::string>& values) {
  auto ident_char = [](char ch, bool first) {
    const auto c = static_cast<unsigned char>(ch);
    return c < 0x80 && (ch == '_' || std::isalpha(c) || (!first && std::isdigit(c)));
  };
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (text[i] != '$' || i + 1 == text.size()) {
      out += text[i++];
      continue;
    }
    if (text[i + 1] == '$') {  // "$$" is an escaped "$"
      out += '$';
      i += 2;
      continue;
    }
    const bool braced = text[i + 1] == '{';
    const size_t start = i + 1 + (braced ? 1 : 0);
    size_t end = start;
    while (end < text.size() && ident_char(text[end], end == start)) ++end;
    const bool closed = !braced || (end < text.size() && text[end] == '}');
    auto it =
        end > start && closed ? values.find(std::string(text.substr(start, end - start))) : values.end();
    if (it != values.end()) {
      out += it->second;
      i = end + (braced ? 1 : 0);
    } else {
      out += text[i++];
    }
  }
  return out;
}

std::string local_hostname() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return {};
  return host;
}

std::string printable(std::string_view text, size_t max) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < text.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (text.size() > max) out += "...";
  return out;
}

}  // namespace ddprun
