#include "agent/state/state_wire.h"

#include <limits>
#include <vector>

#include "rendezvous/util/text_util.h"

namespace ddprun::agent {

namespace {

using Kind = StateMessage::Kind;

constexpr std::pair<Kind, std::string_view> kNames[] = {
    {Kind::kPut, "put"}, {Kind::kGet, "get"}, {Kind::kVersion, "version"}, {Kind::kDone, "done"},
    {Kind::kEnd, "end"}, {Kind::kOk, "ok"},   {Kind::kError, "error"}};

// How many numbers follow each word.
size_t numbers_of(Kind k) {
  switch (k) {
    case Kind::kPut:
    case Kind::kVersion:
      return 3;
    case Kind::kGet:  // or 2 (below)
    case Kind::kDone:
      return 1;
    default:
      return 0;
  }
}

}  // namespace

std::string encode_message(const StateMessage& m) {
  std::string out;
  for (const auto& [kind, name] : kNames) {
    if (kind == m.kind) out = std::string(name);
  }
  switch (m.kind) {
    case Kind::kPut:
    case Kind::kVersion:
      return out + " " + std::to_string(m.rank) + " " + std::to_string(m.step) + " " +
             std::to_string(m.bytes);
    case Kind::kGet:
      return out + " " + std::to_string(m.rank) + (m.step >= 0 ? " " + std::to_string(m.step) : "");
    case Kind::kDone:
      return out + " " + std::to_string(m.crc);
    case Kind::kError:
      return out + " " + m.text;
    default:
      return out;
  }
}

std::optional<StateMessage> decode_message(std::string_view text, std::string& why) {
  const size_t sp = text.find(' ');
  const std::string_view word = text.substr(0, sp);
  StateMessage m;
  bool known = false;
  for (const auto& [kind, name] : kNames) {
    if (name == word) {
      m.kind = kind;
      known = true;
    }
  }
  if (!known) {
    why = "an unknown message '" + printable(text) + "'";
    return std::nullopt;
  }
  const std::string_view rest = sp == std::string_view::npos ? "" : text.substr(sp + 1);
  if (m.kind == Kind::kError) {
    m.text = std::string(rest);
    return m;
  }
  const std::vector<std::string> parts = rest.empty() ? std::vector<std::string>{} : split(rest, ' ');
  std::vector<uint64_t> numbers;
  for (const std::string& p : parts) {
    const auto v = parse_uint(p);
    if (!v || std::to_string(*v) != p) break;
    numbers.push_back(*v);
  }
  const size_t want = m.kind == Kind::kGet && parts.size() == 2 ? 2 : numbers_of(m.kind);
  if (parts.size() != want || numbers.size() != want || (sp != std::string_view::npos && want == 0)) {
    why = "an unreadable message '" + printable(text) + "'";
    return std::nullopt;
  }
  constexpr auto kMaxRank = static_cast<uint64_t>(std::numeric_limits<int>::max());
  constexpr auto kMaxStep = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  switch (m.kind) {
    case Kind::kPut:
    case Kind::kVersion:
      if (numbers[0] > kMaxRank || numbers[1] > kMaxStep || numbers[2] > kMaxStep) {
        why = "a number out of range in '" + printable(text) + "'";
        return std::nullopt;
      }
      m.rank = static_cast<int>(numbers[0]);
      m.step = static_cast<int64_t>(numbers[1]);
      m.bytes = numbers[2];
      break;
    case Kind::kGet:
      if (numbers[0] > kMaxRank || (want == 2 && numbers[1] > kMaxStep)) {
        why = "a number out of range in '" + printable(text) + "'";
        return std::nullopt;
      }
      m.rank = static_cast<int>(numbers[0]);
      m.step = want == 2 ? static_cast<int64_t>(numbers[1]) : -1;
      break;
    case Kind::kDone:
      if (numbers[0] > std::numeric_limits<uint32_t>::max()) {
        why = "a CRC out of range in '" + printable(text) + "'";
        return std::nullopt;
      }
      m.crc = static_cast<uint32_t>(numbers[0]);
      break;
    default:
      break;
  }
  return m;
}

std::string frame_header(uint32_t length) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[static_cast<size_t>(i)] = static_cast<char>((length >> (8 * i)) & 0xff);
  return out;
}

uint32_t frame_length(const unsigned char header[4]) {
  return static_cast<uint32_t>(header[0]) | static_cast<uint32_t>(header[1]) << 8 |
         static_cast<uint32_t>(header[2]) << 16 | static_cast<uint32_t>(header[3]) << 24;
}

}  // namespace ddprun::agent
