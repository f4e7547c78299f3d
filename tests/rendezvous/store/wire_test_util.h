// Shared by the wire codec tests: hex literals, a representative request of every op, a parser run in a
// forced dialect.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "catch_compat.h"
#include "rendezvous/store/wire_codec.h"

namespace ddprun::rdzv::wire_test {

using Catch::Contains;  // the string matcher (catch_compat.h)

inline constexpr Dialect kDialects[] = {Dialect::kLegacy, Dialect::kMid2023, Dialect::kModern};
inline constexpr int kNumOps = static_cast<int>(kOpCount);

// "00 0200 2f" -> bytes; spaces are ignored.
inline std::string from_hex(std::string_view hex) {
  std::string out;
  int nibbles = 0;
  unsigned acc = 0;
  for (char c : hex) {
    if (c == ' ') continue;
    unsigned v = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : c - 'A' + 10;
    acc = acc * 16 + v;
    if (++nibbles == 2) {
      out.push_back(static_cast<char>(acc));
      nibbles = 0;
      acc = 0;
    }
  }
  return out;
}

inline std::span<const uint8_t> span_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

inline std::string u64_le(uint64_t v) {
  std::string out;
  WireWriter(out).u64(v);
  return out;
}

inline std::string u32_le(uint32_t v) {
  std::string out;
  WireWriter(out).u32(v);
  return out;
}

// A representative request of every op, with every field filled (non-trivial values, odd bytes).
inline Request sample(Op op) {
  Request r;
  r.op = op;
  switch (op) {
    case Op::kValidate:
      r.number = kValidationMagic;
      break;
    case Op::kPing:
      r.number = 0xA1B2C3D4;
      break;
    case Op::kAuth:
      r.number = 2;
      r.values = {std::string(32, '\x5a')};
      break;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      r.keys = {"/key"};
      r.values = {std::string("v\0\xff", 3)};
      break;
    case Op::kCompareSet:
      r.keys = {"/cas"};
      r.values = {"old", "new-value"};
      break;
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kWatchKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      r.keys = {"/get"};
      break;
    case Op::kAdd:
      r.keys = {"init/"};
      r.delta = -5;
      break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      r.keys = {"/a", "", "/ccc"};
      break;
    case Op::kMultiSet:
      r.keys = {"/a", "/b"};
      r.values = {"1", ""};
      break;
    case Op::kGetNumKeys:
    case Op::kCancelWait:
    case Op::kListKeys:
      break;
  }
  return r;
}

inline ParseResult parse_forced(Dialect d, const std::string& bytes, Request& out, WireLimits limits = {}) {
  RequestParser parser(limits, d);
  return parser.parse(span_of(bytes), out);
}

}  // namespace ddprun::rdzv::wire_test
