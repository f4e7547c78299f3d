// Parsing and printing of "host:port" endpoints, the form every ddprun flag and message uses.
//
// Accepted forms: "host", "host:port", "1.2.3.4:port", "[v6addr]:port", "[v6addr]", and without brackets
// a whole IPv6 address ("::1", "fe80::2": no port) or, when the whole is not one, an IPv6 address followed
// by ":port" ("::1:29400", as torchrun reads it). Several ':' that are neither ("::::") are an error.
// Pure functions, no name resolution, thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun::rdzv {

struct Endpoint {
  std::string host;  // without brackets; may be a name, an IPv4 or an IPv6 literal
  uint16_t port = 0;

  // "host:port", with brackets around IPv6 literals: "[::1]:29400".
  std::string to_string() const;
  bool operator==(const Endpoint&) const = default;
};

// Parses `text`. When it has no port, `default_port` is used; when that is empty too, an error is returned.
// On error returns nullopt and sets `error` to a message that quotes the input and says what is expected.
std::optional<Endpoint> parse_endpoint(std::string_view text, std::optional<uint16_t> default_port,
                                       std::string& error);

// Parses a decimal TCP port (0..65535). Returns nullopt on anything else (sign, spaces, overflow).
std::optional<uint16_t> parse_port(std::string_view text);

// "host:port" for any host (brackets added when host contains ':').
std::string format_endpoint(std::string_view host, uint16_t port);

}  // namespace ddprun::rdzv
