#include "rendezvous/store/endpoint.h"

#include <arpa/inet.h>

#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

std::string format_endpoint(std::string_view host, uint16_t port) {
  std::string out;
  if (host.find(':') != std::string_view::npos) {
    out.append("[").append(host).append("]");
  } else {
    out.append(host);
  }
  return out.append(":").append(std::to_string(port));
}

namespace {

// An IPv6 address, with or without a zone ("fe80::2%eth0").
bool is_ipv6_literal(std::string_view text) {
  auto zone = text.find('%');
  if (zone != std::string_view::npos && zone + 1 == text.size()) return false;
  in6_addr addr{};
  return inet_pton(AF_INET6, std::string(text.substr(0, zone)).c_str(), &addr) == 1;
}

}  // namespace

std::string Endpoint::to_string() const {
  return format_endpoint(host, port);
}

std::optional<uint16_t> parse_port(std::string_view text) {
  if (text.size() > 5) return std::nullopt;  // "000080" is not a port
  const auto value = parse_uint(text);
  if (!value || *value > 65535) return std::nullopt;
  return static_cast<uint16_t>(*value);
}

std::optional<Endpoint> parse_endpoint(std::string_view text, std::optional<uint16_t> default_port,
                                       std::string& error) {
  auto fail = [&](std::string_view why) -> std::optional<Endpoint> {
    error = "invalid endpoint '" + std::string(text) + "': " + std::string(why) +
            " (expected host, host:port or [ipv6]:port)";
    return std::nullopt;
  };
  Endpoint ep;
  std::string_view port_text;
  bool has_port = false;
  if (text.empty()) return fail("empty");
  if (text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos) return fail("missing ']'");
    ep.host = std::string(text.substr(1, close - 1));
    auto rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return fail("unexpected text after ']'");
      port_text = rest.substr(1);
      has_port = true;
    }
  } else {
    auto first = text.find(':');
    auto last = text.rfind(':');
    if (first != std::string_view::npos && first != last) {
      // Several ':' without brackets: an IPv6 literal ("::1"), else one followed by a port ("::1:29400",
      // as torchrun reads it). Anything else ("::::") is refused here, not left to fail at connect time.
      if (is_ipv6_literal(text)) {
        ep.host = std::string(text);
      } else if (is_ipv6_literal(text.substr(0, last))) {
        ep.host = std::string(text.substr(0, last));
        port_text = text.substr(last + 1);
        has_port = true;
      } else {
        return fail("several ':' but neither an IPv6 address nor one followed by :port (write [ipv6]:port)");
      }
    } else if (first != std::string_view::npos) {
      ep.host = std::string(text.substr(0, first));
      port_text = text.substr(first + 1);
      has_port = true;
    } else {
      ep.host = std::string(text);
    }
  }
  if (ep.host.empty()) return fail("empty host");
  if (ep.host.find_first_of(" \t/[]") != std::string::npos) return fail("bad character in host");
  if (has_port) {
    auto port = parse_port(port_text);
    if (!port) return fail("port '" + std::string(port_text) + "' is not a number in 0..65535");
    ep.port = *port;
  } else if (default_port) {
    ep.port = *default_port;
  } else {
    return fail("no port");
  }
  return ep;
}

}  // namespace ddprun::rdzv
