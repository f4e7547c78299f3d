// The protocol between agents that copies training state (docs/state.md, "Between agents"): the sending
// agent's replicator puts its ranks' versions to its buddy (agent/state/replicator.h), a node restoring
// ranks gets them from the agent that holds them (agent/state/state_keeper.h); the receiving side is
// agent/state/state_server.h. One TCP connection per exchange:
//
//   client: kStateMagic (8 bytes), frame(client nonce)                       "" without the job's secret
//   server: frame(server nonce), frame(proof("state-server", both nonces))  "" "" without
//   client: frame(proof("state-client", both nonces))                        ""
//   server: frame("ok") | frame("error <why>") and close
// then requests, each a frame of text (Message):
//   put <rank> <step> <bytes>   then <bytes> raw bytes of the version file, then "done <crc32c>";
//                               the server answers "ok" once the copy is committed, or "error <why>"
//   get <rank> [<step>]         the server sends, for each version of the rank it holds (only <step>'s when
//                               given), oldest first: "version <rank> <step> <bytes>", the bytes,
//                               "done <crc32c>"; then "end"
// A frame is a u32 little-endian length (at most kMaxStateFrame) and that many bytes. The proofs are
// rendezvous/store/store_auth.h's (HMAC over the job's secret, or MUNGE), with roles of their own.
//
// Pure: encoding and decoding only. Thread-safe. decode_message() reads what a stranger sent: nullopt with
// the reason for anything but exactly what encode_message() writes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun::agent {

inline constexpr std::string_view kStateMagic = "DDPRSTX1";
inline constexpr uint32_t kMaxStateFrame = 64 << 10;
inline constexpr std::string_view kStateServerRole = "state-server";
inline constexpr std::string_view kStateClientRole = "state-client";
// A get's step that asks for every version the server holds of the rank.
inline constexpr int64_t kEveryStep = -1;

struct StateMessage {
  enum class Kind { kPut, kGet, kVersion, kDone, kEnd, kOk, kError } kind = Kind::kOk;
  int rank = 0;
  int64_t step = 0;  // kGet: kEveryStep for every version the server holds
  uint64_t bytes = 0;
  uint32_t crc = 0;
  std::string text;  // kError: why
};

std::string encode_message(const StateMessage& m);
std::optional<StateMessage> decode_message(std::string_view text, std::string& why);

// The 4-byte length that precedes a frame's bytes, and back.
std::string frame_header(uint32_t length);
uint32_t frame_length(const unsigned char header[4]);

}  // namespace ddprun::agent
