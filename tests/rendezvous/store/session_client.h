// Test helpers for StoreSession: requests built and encoded, one client connection as a session, and reply
// fields read back with WireReader. Header-only, for the session's unit tests.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "rendezvous/store/key_value_state.h"
#include "rendezvous/store/store_session.h"
#include "rendezvous/store/wire_codec.h"

namespace ddprun::rdzv::session_testing {

inline std::span<const uint8_t> span_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

inline std::string encode(Dialect d, const Request& req) {
  std::string out;
  REQUIRE(encode_request(d, req, out));
  return out;
}

inline Request req(Op op, std::vector<std::string> keys = {}, std::vector<std::string> values = {}) {
  Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.values = std::move(values);
  return r;
}

inline Request add_req(std::string key, int64_t delta) {
  Request r = req(Op::kAdd, {std::move(key)});
  r.delta = delta;
  return r;
}

inline Request numbered(Op op, uint32_t number) {
  Request r;
  r.op = op;
  r.number = number;
  return r;
}

// One client connection: a session whose async notifications are counted.
class Client {
 public:
  Client(KeyValueState& state, Dialect dialect, bool forced = true, SharedBytes* ledger = nullptr)
      : dialect_(dialect),
        session_(
            state, WireLimits{}, forced ? std::optional<Dialect>(dialect) : std::nullopt,
            [this] { ++async_; }, ledger) {}

  // Sends one whole request; it must be consumed entirely and without error. Its reply stays queued.
  void send(const Request& r) {
    std::string bytes = encode(dialect_, r);
    StoreSession::ConsumeResult res = session_.consume(span_of(bytes));
    INFO(op_name(r.op) << ": " << res.error);
    REQUIRE(res.error.empty());
    REQUIRE(res.consumed == bytes.size());
    REQUIRE(res.requests == 1);
  }
  // send(), then returns the reply bytes (everything queued).
  std::string call(const Request& r) {
    send(r);
    return take();
  }
  // Moves the pending output out.
  std::string take() {
    std::string out = session_.output().flatten();
    session_.output().clear();
    return out;
  }

  StoreSession& session() { return session_; }
  int async() const { return async_; }

 private:
  Dialect dialect_;
  int async_ = 0;
  StoreSession session_;
};

// Reads reply fields; every read must succeed.
class Reply {
 public:
  explicit Reply(std::string bytes) : bytes_(std::move(bytes)), r_(span_of(bytes_)) {}
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;

  uint8_t u8() {
    uint8_t v = 0;
    REQUIRE(r_.u8(v));
    return v;
  }
  uint32_t u32() {
    uint32_t v = 0;
    REQUIRE(r_.u32(v));
    return v;
  }
  int64_t i64() {
    int64_t v = 0;
    REQUIRE(r_.i64(v));
    return v;
  }
  std::string bytes() {
    std::string v;
    REQUIRE(r_.bytes(v, 1 << 20) == WireReader::BytesStatus::kOk);
    return v;
  }
  size_t remaining() const { return r_.remaining(); }

 private:
  std::string bytes_;
  WireReader r_;
};

inline std::string get_value(Client& c, const std::string& key) {
  Reply r(c.call(req(Op::kGet, {key})));
  return r.bytes();
}

inline bool has_key(Client& c, const std::string& key) {
  Reply r(c.call(req(Op::kCheck, {key})));
  return r.u8() == kCheckReady;
}

}  // namespace ddprun::rdzv::session_testing
