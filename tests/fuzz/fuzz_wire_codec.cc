// libFuzzer target: RequestParser over arbitrary bytes.
//
// Input: one configuration byte, then the byte stream of one connection.
//   bits 0-1: dialect: 0 legacy, 1 mid2023, 2 modern (forced), 3 detected from the stream
//   bit 2:    tiny limits (so that the limit checks are reached with short inputs)
// Properties checked (abort on violation; ASan/UBSan catch the rest):
//   - the parser never reads past the input and never crashes;
//   - kNeedMore consumes nothing; kDone consumes at least one byte, no more than given; kError says why;
//   - a parsed request re-encodes (encode_request, same dialect) to exactly the bytes it was parsed from,
//     and parsing those bytes again gives the same Request;
//   - every strict prefix of a parsed request is kNeedMore (the parser never decides early).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>

#include "rendezvous/store/wire_codec.h"

namespace {

using ddprun::rdzv::Dialect;
using ddprun::rdzv::ParseResult;
using ddprun::rdzv::ParseStatus;
using ddprun::rdzv::Request;
using ddprun::rdzv::RequestParser;
using ddprun::rdzv::WireLimits;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_wire_codec: property violated: %s\n", what);
    std::abort();
  }
}

WireLimits tiny_limits() {
  WireLimits l;
  l.max_key_bytes = 16;
  l.max_value_bytes = 64;
  l.max_keys_per_request = 4;
  l.max_request_bytes = 200;
  return l;
}

// Every strict prefix of a complete request must ask for more bytes.
void check_prefixes(const WireLimits& limits, std::optional<Dialect> dialect,
                    std::span<const uint8_t> request) {
  size_t n = request.size();
  size_t step = n <= 128 ? 1 : n / 64;
  for (size_t len = 0; len < n; len += step) {
    RequestParser p(limits, dialect);
    Request r;
    ParseResult res = p.parse(request.first(len), r);
    check(res.status == ParseStatus::kNeedMore, "a strict prefix of a request is not kNeedMore");
    check(res.consumed == 0, "kNeedMore consumed bytes");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t config = data[0];
  std::optional<Dialect> forced;
  if ((config & 3) != 3) forced = static_cast<Dialect>(config & 3);
  const WireLimits limits = (config & 4) ? tiny_limits() : WireLimits{};
  std::span<const uint8_t> input(data + 1, size - 1);

  RequestParser parser(limits, forced);
  size_t pos = 0;
  bool first = true;
  while (true) {
    Request req;
    std::span<const uint8_t> rest = input.subspan(pos);
    ParseResult res = parser.parse(rest, req);
    if (res.status == ParseStatus::kNeedMore) {
      check(res.consumed == 0, "kNeedMore consumed bytes");
      break;
    }
    if (res.status == ParseStatus::kError) {
      check(!res.error.empty(), "kError without a message");
      break;
    }
    check(res.consumed > 0 && res.consumed <= rest.size(), "kDone consumed a wrong number of bytes");
    check(parser.dialect().has_value(), "kDone without a dialect");
    const Dialect dialect = *parser.dialect();
    std::span<const uint8_t> raw = rest.first(res.consumed);

    std::string encoded;
    check(ddprun::rdzv::encode_request(dialect, req, encoded), "a parsed op cannot be encoded");
    check(encoded.size() == raw.size() && std::memcmp(encoded.data(), raw.data(), raw.size()) == 0,
          "re-encoding does not give the parsed bytes");

    RequestParser again(limits, dialect);
    Request req2;
    auto bytes = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(encoded.data()), encoded.size());
    ParseResult res2 = again.parse(bytes, req2);
    check(res2.status == ParseStatus::kDone && res2.consumed == encoded.size(), "re-parse failed");
    check(req2 == req, "re-parse gives a different request");

    // The first request of an auto-detecting connection also decides the dialect: check its prefixes with
    // detection on, the later ones with the dialect fixed.
    check_prefixes(limits, first ? forced : std::optional<Dialect>(dialect), raw);
    first = false;
    pos += res.consumed;
  }

  // The dialect guess needs at most 5 bytes and never depends on what follows them.
  auto detected = ddprun::rdzv::detect_dialect(input);
  if (input.size() >= 5) check(detected.has_value(), "no dialect after 5 bytes");
  if (detected && input.size() > 5) {
    check(ddprun::rdzv::detect_dialect(input.first(5)) == detected,
          "the dialect guess changed after 5 bytes");
  }
  return 0;
}
