// Tests of "host:port" parsing and printing.
#include "rendezvous/store/endpoint.h"

#include <optional>
#include <string>

#include "catch_compat.h"

namespace ddprun::rdzv {
namespace {

using Catch::Contains;  // the string matcher (catch_compat.h)

struct Good {
  const char* text;
  std::optional<uint16_t> default_port;
  const char* host;
  uint16_t port;
};

TEST_CASE("parse_endpoint accepts the documented forms", "[endpoint]") {
  const Good cases[] = {
      {"host", 29400, "host", 29400},
      {"host:29400", std::nullopt, "host", 29400},
      {"host:29400", 1, "host", 29400},  // an explicit port wins over the default
      {"1.2.3.4:80", std::nullopt, "1.2.3.4", 80},
      {"1.2.3.4", 5, "1.2.3.4", 5},
      {"node-01.cluster.example:0", std::nullopt, "node-01.cluster.example", 0},
      {"host:65535", std::nullopt, "host", 65535},
      {"[::1]:29400", std::nullopt, "::1", 29400},
      {"[::1]", 29500, "::1", 29500},
      {"[fe80::2%eth0]:1", std::nullopt, "fe80::2%eth0", 1},
      {"::1", 29400, "::1", 29400},  // bare IPv6: no port possible
      {"fe80::2", 7, "fe80::2", 7},
      {"::", 7, "::", 7},
      {"fe80::2%eth0", 7, "fe80::2%eth0", 7},
      {"::1:29400", std::nullopt, "::1", 29400},  // not an address as a whole: the last field is the port
      {"fe80::2:8080", 7, "fe80::2:8080", 7},     // an address as a whole: no port (write [fe80::2]:8080)
  };
  for (const Good& c : cases) {
    INFO("'" << c.text << "'");
    std::string error;
    auto ep = parse_endpoint(c.text, c.default_port, error);
    REQUIRE(ep.has_value());
    CHECK(ep->host == c.host);
    CHECK(ep->port == c.port);
    CHECK(error.empty());
  }
}

struct Bad {
  const char* text;
  const char* why;  // a fragment of the error message
};

TEST_CASE("parse_endpoint rejects malformed input with a message quoting it", "[endpoint]") {
  const Bad cases[] = {
      {"", "empty"},
      {"host:", "port ''"},
      {"host:abc", "port 'abc'"},
      {"host:70000", "port '70000'"},
      {"host:65536", "port '65536'"},
      {"host:-1", "port '-1'"},
      {"host:+1", "port '+1'"},
      {"host:80x", "port '80x'"},
      {"[::1", "missing ']'"},
      {"::::", "neither an IPv6 address"},
      {"a:b:c", "neither an IPv6 address"},
      {"::1:99999", "port '99999'"},
      {"[::1]x", "unexpected text after ']'"},
      {"[::1]:", "port ''"},
      {"[::1]:99999", "port '99999'"},
      {"[]:80", "empty host"},
      {":80", "empty host"},
      {" host:80", "bad character"},
      {"host :80", "bad character"},
      {"host: 80", "port ' 80'"},
      {"host:80 ", "port '80 '"},
      {"ho st", "bad character"},
      {"[ ::1]:80", "bad character"},
      {"a/b:80", "bad character"},
  };
  for (const Bad& c : cases) {
    INFO("'" << c.text << "'");
    std::string error;
    auto ep = parse_endpoint(c.text, 29400, error);
    CHECK_FALSE(ep.has_value());
    CHECK_THAT(error, Contains(std::string("'") + c.text + "'") && Contains(c.why) &&
                          Contains("expected host, host:port or [ipv6]:port"));
  }
}

TEST_CASE("a missing port needs a default", "[endpoint]") {
  for (const char* text : {"host", "[::1]", "::1", "10.0.0.1"}) {
    INFO("'" << text << "'");
    std::string error;
    CHECK_FALSE(parse_endpoint(text, std::nullopt, error).has_value());
    CHECK_THAT(error, Contains("no port"));
    auto ep = parse_endpoint(text, 0, error);
    REQUIRE(ep.has_value());
    CHECK(ep->port == 0);
  }
}

TEST_CASE("format_endpoint brackets IPv6 literals", "[endpoint]") {
  CHECK(format_endpoint("host", 29400) == "host:29400");
  CHECK(format_endpoint("1.2.3.4", 0) == "1.2.3.4:0");
  CHECK(format_endpoint("::1", 65535) == "[::1]:65535");
  CHECK(format_endpoint("fe80::2", 80) == "[fe80::2]:80");
  CHECK(Endpoint{"::1", 29400}.to_string() == "[::1]:29400");
  CHECK(Endpoint{"h", 1}.to_string() == "h:1");

  // What is printed parses back to the same endpoint.
  for (const Endpoint& ep :
       {Endpoint{"host", 1}, Endpoint{"::1", 29400}, Endpoint{"10.1.2.3", 65535}, Endpoint{"fe80::1:2", 0}}) {
    std::string error;
    auto back = parse_endpoint(ep.to_string(), std::nullopt, error);
    REQUIRE(back.has_value());
    CHECK(*back == ep);
  }
}

TEST_CASE("parse_port", "[endpoint]") {
  CHECK(parse_port("0") == 0);
  CHECK(parse_port("1") == 1);
  CHECK(parse_port("29400") == 29400);
  CHECK(parse_port("65535") == 65535);
  CHECK(parse_port("00080") == 80);
  for (const char* bad : {"65536", "99999", "100000", "000080", "-1", "+1", " 1", "1 ", "", "0x10", "1e3",
                          "abc", "4294967297", "18446744073709551617"}) {
    INFO("'" << bad << "'");
    CHECK_FALSE(parse_port(bad).has_value());
  }
}

}  // namespace
}  // namespace ddprun::rdzv
