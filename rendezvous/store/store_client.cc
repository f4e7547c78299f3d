#include "rendezvous/store/store_client.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <cstring>
#include <thread>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

#include "rendezvous/store/endpoint.h"
#include "rendezvous/store/store_client_connection.h"
#include "rendezvous/store/store_error.h"

namespace ddprun::rdzv {

using Clock = std::chrono::steady_clock;

namespace {

std::string keys_text(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size() && i < 8; ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 8) out += ", ... (" + std::to_string(keys.size()) + " keys)";
  return out + "]";
}

}  // namespace

StoreClient::StoreClient(std::string host, uint16_t port, StoreClientOptions options)
    : Store(options.timeout),
      host_(std::move(host)),
      port_(port),
      endpoint_(format_endpoint(host_, port)),
      options_(std::move(options)) {
  std::lock_guard lock(mu_);
  connect_locked();
}

StoreClient::~StoreClient() = default;

void StoreClient::close() {
  std::lock_guard lock(mu_);
  closed_ = true;
  conn_.reset();
}

void StoreClient::set_connect_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard lock(mu_);
  options_.connect_timeout = timeout;
}

void StoreClient::connect_locked() {
  auto deadline = Clock::now() + options_.connect_timeout;
  auto conn = std::make_unique<Connection>(host_, port_, endpoint_, deadline);
  if (options_.dialect == Dialect::kModern) {
    // VALIDATE proves we speak the protocol; PING proves the server does (an old server stays silent).
    uint32_t nonce =
        static_cast<uint32_t>(::getpid()) ^ static_cast<uint32_t>(Clock::now().time_since_epoch().count());
    std::string out;
    encode_request(Dialect::kModern, Request{.op = Op::kValidate, .number = kValidationMagic}, out);
    encode_request(Dialect::kModern, Request{.op = Op::kPing, .number = nonce}, out);
    const auto start = Clock::now();
    auto hs_deadline = std::min(start + std::chrono::seconds(10), start + options_.timeout);
    conn->write(out, hs_deadline, "handshake");
    uint32_t echoed = 0;
    try {
      echoed = conn->read_value<uint32_t>(hs_deadline, "handshake");
    } catch (const TimeoutError&) {
      // Silence: a store that stalls, or a torch 1.13/2.0 TCPStore, which waits for the rest of what it
      // takes for a legacy request.
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(hs_deadline - start);
      throw HandshakeTimeoutError(
          "handshake: no reply from the store at " + endpoint_ + " within " + std::to_string(waited.count()) +
          " ms (a stalled store; or a torch 1.13/2.0 TCPStore, which needs the legacy "
          "dialect)");
    }
    if (echoed != nonce) {
      throw BadReplyError("the store at " + endpoint_ + " answered PING with a wrong nonce");
    }
    if (options_.auth) authenticate(*conn, hs_deadline);
  }
  conn_ = std::move(conn);
}

StoreClient::Connection& StoreClient::send(const Request& req, Clock::time_point deadline) {
  if (closed_)
    throw ClosedError(std::string(op_name(req.op)) + ": the client of " + endpoint_ + " is closed");
  if (!conn_ || conn_->broken()) {
    conn_.reset();
    connect_locked();
  }
  std::string bytes;
  if (!encode_request(options_.dialect, req, bytes)) {
    throw InvalidArgumentError(std::string(op_name(req.op)) + " does not exist in the " +
                               std::string(dialect_name(options_.dialect)) + " dialect of " + endpoint_);
  }
  conn_->write(bytes, deadline, describe(req.op, req.keys.empty() ? "" : req.keys[0]));
  return *conn_;
}

std::string StoreClient::describe(Op op, std::string_view key) const {
  std::string out(op_name(op));
  if (!key.empty()) out.append(" '").append(key).append("'");
  return out;
}

std::string StoreClient::prefixed(std::string_view key) const {
  if (options_.key_prefix.size() + key.size() > options_.limits.max_key_bytes) {
    throw InvalidArgumentError("key '" + std::string(key.substr(0, 64)) + "...' is longer than " +
                               std::to_string(options_.limits.max_key_bytes) + " bytes");
  }
  std::string out;
  out.reserve(options_.key_prefix.size() + key.size());
  return out.append(options_.key_prefix).append(key);
}

std::vector<std::string> StoreClient::prefixed(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(prefixed(k));
  return out;
}

namespace {

void check_value(std::string_view value, const WireLimits& limits) {
  if (value.size() > limits.max_value_bytes) {
    throw InvalidArgumentError("value of " + std::to_string(value.size()) + " bytes is over the limit of " +
                               std::to_string(limits.max_value_bytes));
  }
}

Clock::time_point deadline_after(std::chrono::milliseconds t) {
  return Clock::now() + t;
}

}  // namespace

void StoreClient::set(std::string_view key, std::string_view value) {
  check_value(value, options_.limits);
  std::lock_guard lock(mu_);
  send(Request{.op = Op::kSet, .keys = {prefixed(key)}, .values = {std::string(value)}},
       deadline_after(timeout()));
}

std::string StoreClient::get(std::string_view key) {
  std::lock_guard lock(mu_);
  std::string k = prefixed(key);
  wait_locked({k}, timeout());
  auto deadline = deadline_after(timeout());
  auto& c = send(Request{.op = Op::kGet, .keys = {k}}, deadline);
  return c.read_bytes(options_.limits.max_value_bytes, deadline, describe(Op::kGet, key));
}

int64_t StoreClient::add(std::string_view key, int64_t delta) {
  std::lock_guard lock(mu_);
  auto deadline = deadline_after(timeout());
  auto& c = send(Request{.op = Op::kAdd, .keys = {prefixed(key)}, .delta = delta}, deadline);
  return c.read_value<int64_t>(deadline, describe(Op::kAdd, key));
}

std::string StoreClient::compare_set(std::string_view key, std::string_view expected,
                                     std::string_view desired) {
  check_value(expected, options_.limits);
  check_value(desired, options_.limits);
  std::lock_guard lock(mu_);
  auto deadline = deadline_after(timeout());
  auto& c = send(Request{.op = Op::kCompareSet,
                         .keys = {prefixed(key)},
                         .values = {std::string(expected), std::string(desired)}},
                 deadline);
  return c.read_bytes(options_.limits.max_value_bytes, deadline, describe(Op::kCompareSet, key));
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  auto deadline = deadline_after(timeout());
  auto& c = send(Request{.op = Op::kCheck, .keys = prefixed(keys)}, deadline);
  uint8_t r = c.read_value<uint8_t>(deadline, "CHECK");
  if (r != kCheckReady && r != kCheckNotReady) {
    c.mark_broken();
    throw BadReplyError("CHECK: the store at " + endpoint_ + " replied " + std::to_string(r));
  }
  return r == kCheckReady;
}

void StoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::lock_guard lock(mu_);
  wait_locked(prefixed(keys), timeout);
}

void StoreClient::wait_locked(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  auto deadline = deadline_after(timeout);
  auto& c = send(Request{.op = Op::kWait, .keys = keys}, deadline);
  auto timed_out = [&] {
    return WaitTimeoutError("WAIT " + keys_text(keys) + ": keys did not appear in the store at " + endpoint_ +
                            " within " + std::to_string(timeout.count()) + " ms");
  };
  if (c.wait_readable(deadline, "WAIT")) {
    uint8_t r = c.read_value<uint8_t>(deadline, "WAIT");
    if (r != kWaitStopWaiting) {
      c.mark_broken();
      throw BadReplyError("WAIT: the store at " + endpoint_ + " replied " + std::to_string(r));
    }
    return;
  }
  if (options_.dialect == Dialect::kLegacy) {
    // Legacy servers cannot cancel a wait: its late reply would desynchronise the stream. Start afresh.
    c.mark_broken();
    throw timed_out();
  }
  // The cancel is a request like any other: its reply comes within timeout(), or the store is stalled.
  auto cancel_deadline = deadline_after(StoreClient::timeout());
  send(Request{.op = Op::kCancelWait}, cancel_deadline);
  uint8_t r = c.read_value<uint8_t>(cancel_deadline, "CANCEL_WAIT");
  const bool raced = r == kWaitStopWaiting;  // the keys appeared before the cancel: the WAIT succeeded
  if (raced) r = c.read_value<uint8_t>(cancel_deadline, "CANCEL_WAIT");
  if (r != kWaitCanceled) {
    c.mark_broken();
    throw BadReplyError("CANCEL_WAIT: the store at " + endpoint_ + " replied " + std::to_string(r));
  }
  if (!raced) throw timed_out();
}

bool StoreClient::delete_key(std::string_view key) {
  std::lock_guard lock(mu_);
  auto deadline = deadline_after(timeout());
  auto& c = send(Request{.op = Op::kDeleteKey, .keys = {prefixed(key)}}, deadline);
  return c.read_value<int64_t>(deadline, describe(Op::kDeleteKey, key)) == 1;
}

int64_t StoreClient::num_keys() {
  std::lock_guard lock(mu_);
  auto deadline = deadline_after(timeout());
  auto& c = send(Request{.op = Op::kGetNumKeys}, deadline);
  return c.read_value<int64_t>(deadline, "GETNUMKEYS");
}

void StoreClient::append(std::string_view key, std::string_view value) {
  check_value(value, options_.limits);
  std::lock_guard lock(mu_);
  send(Request{.op = Op::kAppend, .keys = {prefixed(key)}, .values = {std::string(value)}},
       deadline_after(timeout()));
}

std::vector<std::string> StoreClient::multi_get(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  auto ks = prefixed(keys);
  wait_locked(ks, timeout());
  auto deadline = deadline_after(timeout());
  auto& c = send(Request{.op = Op::kMultiGet, .keys = ks}, deadline);
  std::vector<std::string> out;
  out.reserve(ks.size());
  for (size_t i = 0; i < ks.size(); ++i) {
    out.push_back(c.read_bytes(options_.limits.max_value_bytes, deadline, "MULTI_GET"));
  }
  return out;
}

void StoreClient::multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw InvalidArgumentError("MULTI_SET: " + std::to_string(keys.size()) + " keys but " +
                               std::to_string(values.size()) + " values");
  }
  for (const auto& v : values) check_value(v, options_.limits);
  std::lock_guard lock(mu_);
  send(Request{.op = Op::kMultiSet, .keys = prefixed(keys), .values = values}, deadline_after(timeout()));
}

void StoreClient::queue_push(std::string_view key, std::string_view value) {
  check_value(value, options_.limits);
  std::lock_guard lock(mu_);
  send(Request{.op = Op::kQueuePush, .keys = {prefixed(key)}, .values = {std::string(value)}},
       deadline_after(timeout()));
}

std::optional<std::string> StoreClient::queue_pop(std::string_view key, bool block,
                                                  std::chrono::milliseconds timeout) {
  std::lock_guard lock(mu_);
  std::string k = prefixed(key);
  if (block) wait_locked({k}, timeout);
  auto deadline = deadline_after(this->timeout());
  auto& c = send(Request{.op = Op::kQueuePop, .keys = {k}}, deadline);
  auto n = c.read_value<int64_t>(deadline, describe(Op::kQueuePop, key));  // length before the pop
  if (n <= 0) return std::nullopt;
  return c.read_bytes(options_.limits.max_value_bytes, deadline, describe(Op::kQueuePop, key));
}

int64_t StoreClient::queue_len(std::string_view key) {
  std::lock_guard lock(mu_);
  auto deadline = deadline_after(timeout());
  auto& c = send(Request{.op = Op::kQueueLen, .keys = {prefixed(key)}}, deadline);
  return c.read_value<int64_t>(deadline, describe(Op::kQueueLen, key));
}

std::chrono::microseconds StoreClient::ping() {
  std::lock_guard lock(mu_);
  auto start = Clock::now();
  auto deadline = deadline_after(timeout());
  uint32_t nonce = static_cast<uint32_t>(start.time_since_epoch().count());
  auto& c = send(Request{.op = Op::kPing, .number = nonce}, deadline);
  if (c.read_value<uint32_t>(deadline, "PING") != nonce) {
    c.mark_broken();
    throw BadReplyError("PING: the store at " + endpoint_ + " echoed a wrong nonce");
  }
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
}

}  // namespace ddprun::rdzv
