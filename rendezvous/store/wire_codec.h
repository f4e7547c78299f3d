// The TCPStore wire codec: requests and replies of PyTorch's TCPStore protocol, as bytes.
//
// Pure code: no sockets, no clocks, no global state; every function is thread-compatible. The format is
// described in docs/wire-protocol.md. In short: a request is one command byte followed by its fields;
// integers are little-endian; strings are a u64 length followed by raw bytes. There is no framing, so the
// parser is incremental: it reports kNeedMore until a whole request is buffered (torch 1.13 clients send
// each field with its own send()), and never reads past the request it returns.
//
// Three dialects exist, numbered differently (see Dialect). A server does not know in advance which one a
// client speaks: RequestParser detects it from the first bytes of the connection (detect_dialect).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::rdzv {

enum class Dialect : uint8_t {
  kLegacy,   // torch 1.13 and 2.0: SET 0 .. GETNUMKEYS 6, WATCH_KEY 7, DELETE_KEY 8
  kMid2023,  // torch main of mid-2023, no validation: DELETE_KEY 7, APPEND 8, MULTI_GET 9, MULTI_SET 10,
             // CANCEL_WAIT 11
  kModern,  // torch 2.x with validation: VALIDATE 0, SET 1, ... CANCEL_WAIT 12, PING 13, QUEUE_* 14..16, LIST
            // 17
};
std::string_view dialect_name(Dialect d);
std::optional<Dialect> parse_dialect(std::string_view name);  // "legacy", "mid2023", "modern"

// Every operation of every dialect; a dialect supports a subset (op_from_byte / op_to_byte).
enum class Op : uint8_t {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kWatchKey,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kListKeys,
  kAuth,  // ddprun's extension, byte 0xDD in every dialect: an agent proves the job's secret (store_auth.h)
};
inline constexpr size_t kOpCount = static_cast<size_t>(Op::kAuth) + 1;
std::string_view op_name(Op op);
std::optional<Op> op_from_byte(Dialect d, uint8_t byte);
std::optional<uint8_t> op_to_byte(Dialect d, Op op);

// Magic number a modern client sends after VALIDATE (bytes CE F7 85 3C on the wire).
inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;

// Reply codes.
inline constexpr uint8_t kCheckReady = 0;
inline constexpr uint8_t kCheckNotReady = 1;
inline constexpr uint8_t kWaitStopWaiting = 0;
inline constexpr uint8_t kWaitCanceled = 1;
// Legacy WATCH_KEY notifications (torch 1.13 WatchResponseType).
enum class WatchEvent : uint8_t {
  kKeyUpdated = 0,
  kKeyCreated = 1,
  kKeyDeleted = 2,
  kCallbackRegistered = 3
};

// Protective limits. A request that declares a size above these is rejected before anything is buffered.
struct WireLimits {
  size_t max_key_bytes = 64 * 1024;
  size_t max_value_bytes = 64 * 1024 * 1024;
  size_t max_keys_per_request = 128 * 1024;           // CHECK, WAIT, MULTI_GET, MULTI_SET
  size_t max_request_bytes = 128 * 1024 * 1024 + 64;  // a whole request, all fields together
  size_t max_auth_bytes = 4096;  // an AUTH value (a nonce, a proof): StoreAuth::kMaxProofBytes
  // Per connection (StoreSession): WAITs pending at once and keys watched (WATCH_KEY). torch clients block
  // in each WAIT, so they have one pending at a time.
  size_t max_pending_waits = 1024;
  size_t max_watched_keys = 1024;
};

// One decoded request. Field use by op:
//   SET, APPEND, QUEUE_PUSH: keys[0], values[0]       GET, DELETE_KEY, WATCH_KEY, QUEUE_POP, QUEUE_LEN:
//   keys[0] COMPARE_SET: keys[0], values = {expected, desired} ADD: keys[0], delta CHECK, WAIT, MULTI_GET:
//   keys                       MULTI_SET: keys, values (same length) VALIDATE: number (the magic) PING:
//   number (the nonce) GETNUMKEYS, CANCEL_WAIT, LIST: nothing   AUTH: number (the phase), values[0]
struct Request {
  Op op = Op::kGetNumKeys;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  int64_t delta = 0;
  uint32_t number = 0;

  bool operator==(const Request&) const = default;
};

enum class ParseStatus { kDone, kNeedMore, kError };
struct ParseResult {
  ParseStatus status = ParseStatus::kNeedMore;
  size_t consumed = 0;  // bytes of the input that made up the request (kDone only)
  std::string error;    // what was wrong (kError only)
};

// Detects the dialect from the first bytes of a connection. Returns nullopt while more bytes are needed
// (at most 5). A modern client starts with VALIDATE + magic; a client whose first command byte exists only
// in the mid-2023 numbering (9, 10, 11) is mid-2023; anything else is legacy.
std::optional<Dialect> detect_dialect(std::span<const uint8_t> first_bytes);

// Incremental request parser for one connection. Not thread-safe; one instance per connection.
class RequestParser {
 public:
  // `forced`: skip detection and use this dialect for the whole connection.
  explicit RequestParser(WireLimits limits, std::optional<Dialect> forced = std::nullopt);

  // Parses one request from the front of `input` into `out`. kNeedMore consumes nothing: call again with
  // the same bytes plus more (the parser keeps the fields it already read and resumes after them, so a
  // request that arrives in many pieces is read once). kError means the connection must be dropped: the
  // stream cannot be re-synced.
  ParseResult parse(std::span<const uint8_t> input, Request& out);

  std::optional<Dialect> dialect() const { return dialect_; }
  const WireLimits& limits() const { return limits_; }

 private:
  // A request cut short by the end of the input: its whole fields so far.
  struct Resume {
    size_t fields = 0;    // fields parsed (0: start afresh)
    size_t position = 0;  // where the next field starts, from the request's first byte
    size_t needed = 0;    // input shorter than this cannot get further
    uint64_t count = 0;   // a multi-key op's key count, once read
    Request partial;
  };

  WireLimits limits_;
  std::optional<Dialect> dialect_;
  Resume resume_;
};

// Appends fields in wire format. Used for replies (server) and requests (client).
class WireWriter {
 public:
  explicit WireWriter(std::string& out) : out_(out) {}
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) { raw(&v, sizeof v); }
  void u64(uint64_t v) { raw(&v, sizeof v); }
  void i64(int64_t v) { raw(&v, sizeof v); }
  void bytes(std::string_view v) {
    u64(v.size());
    out_.append(v);
  }

 private:
  void raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string& out_;
};

// Reads fields in wire format from a buffer; each getter returns false when the buffer is too short and
// then leaves the position unchanged. Lengths are checked against `max_len` before any copy.
class WireReader {
 public:
  explicit WireReader(std::span<const uint8_t> in) : in_(in) {}
  bool u8(uint8_t& v);
  bool u32(uint32_t& v);
  bool u64(uint64_t& v);
  bool i64(int64_t& v);
  bool peek_u64(uint64_t& v) const;
  void skip(size_t n) { pos_ += std::min(n, remaining()); }
  enum class BytesStatus { kOk, kShort, kTooLong };
  BytesStatus bytes(std::string& v, size_t max_len);
  size_t position() const { return pos_; }
  size_t remaining() const { return in_.size() - pos_; }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

// Encodes a request in the given dialect (client side). Returns false if the dialect lacks the op.
bool encode_request(Dialect d, const Request& req, std::string& out);

}  // namespace ddprun::rdzv
