// Small text helpers shared by every component: splitting and reading numbers in text, and this machine's
// host name. In ddprun_util (rendezvous/util/CMakeLists.txt), the lowest layer: the agent, the launcher, the
// store and the worker SDK link it. Pure except local_hostname() (one system call). Thread-safe; nothing
// throws except std::bad_alloc.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun {

// The value of `name` in an environment map, or `fallback` when it is absent or empty (an empty variable
// counts as unset, as torchrun reads its PET_ variables).
std::string env_or(const std::map<std::string, std::string>& env, const std::string& name,
                   const std::string& fallback = "");

// "a,b,,c" -> {"a", "b", "", "c"}; "" -> {""} (always at least one part).
std::vector<std::string> split(std::string_view text, char sep);
// {"a", "b"}, ", " -> "a, b"; {} -> "".
std::string join(const std::vector<std::string>& parts, std::string_view sep);
// Without leading and trailing blanks (space, tab, newline).
std::string trim(const std::string& s);

// The whole of `text` as a decimal integer with an optional sign ("+3", "-1"), or nullopt (empty, other
// characters, out of range). No spaces are skipped: trim first where a user may type them.
std::optional<long long> parse_int(std::string_view text);
// parse_int within [lo, hi], as T (a pid, a rank, a port): nullopt outside.
template <class T>
std::optional<T> parse_int_in(std::string_view text, long long lo, long long hi) {
  const auto v = parse_int(text);
  if (!v || *v < lo || *v > hi) return std::nullopt;
  return static_cast<T>(*v);
}
// The whole of `text` as an unsigned decimal number: digits only (no sign, no spaces), or nullopt (empty,
// other characters, more than 64 bits).
std::optional<uint64_t> parse_uint(std::string_view text);

// A size in bytes: a whole decimal number with an optional binary unit, any case, no spaces: "65536",
// "64K" / "64KiB" (x 1024), "256M" / "256MiB", "1G" / "1GiB". nullopt for anything else or a size that does
// not fit 64 bits.
std::optional<uint64_t> parse_byte_size(std::string_view text);
// Whole mebibytes, for messages: "12 MiB".
std::string mib_text(uint64_t bytes);
// Python's string.Template(text).safe_substitute(values): "$name" and "${name}" (name: an ASCII letter or
// '_', then letters, digits, '_'; the longest such run) become values[name] when it is there and stay as they
// are otherwise; "$$" becomes "$"; any other '$' is kept. torchrun uses it for ${local_rank} in script
// arguments and for TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE.
std::string template_substitute(std::string_view text, const std::map<std::string, std::string>& values);

// `text` for an error message: at most `max` bytes (then "..."), each byte outside printable ASCII as "\xNN".
std::string printable(std::string_view text, size_t max = 80);

// gethostname(2) as given by the system (maybe a fully qualified name); "" when it fails.
std::string local_hostname();

}  // namespace ddprun
