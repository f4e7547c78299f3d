// libFuzzer target: two StoreSessions sharing one KeyValueState, fed interleaved chunks of bytes the way
// the server feeds them (partial requests kept for the next chunk, a broken client replaced by a new one).
// Everything runs twice, in two worlds fed the same records: one whose replies reference stored values
// (shared buffers, counted on a SharedBytes ledger, from a size set by the configuration byte down to 1
// byte), one that copies every value. Both must put the same bytes on the wire.
//
// Input: one configuration byte, then records.
//   config bits 0-1: dialect of session 0 (0 legacy, 1 mid2023, 2 modern, 3 detect); bits 2-3: session 1;
//          bit 4: tiny limits (4 pending WAITs and 4 watched keys per connection among them); bit 5: small
//          output budget (the server's max_output_bytes); bits 6-7: the sharing world references values
//          of 1, 9, 17 or 25 bytes and more.
//   record: one header byte h, then its data.
//     h < 0xF0: a chunk of (h >> 1) bytes (fewer at the end of the input) for session (h & 1);
//     0xF0/0xF1: session 0/1 disconnects (destroyed, a fresh one takes its place);
//     0xF2/0xF3: the server writes session 0/1's output (output() is cleared);
//     other: ignored.
// Session 1 is a stranger to a store with a secret (StoreSession's admission: a deterministic StoreAuth whose
// proof is role[0] + the nonces' first 4 bytes, so the fuzzer can learn to pass AUTH, as an agent or as an
// observer; its address is not the job's): until it proved the secret as an agent, its requests must change
// no key. The sharing world's auth blocks (StoreAuth::blocks(): its AUTH steps go through take_auth_step()
// and finish_auth(), as the server runs MUNGE's off its thread), the copying world's runs inline: the same
// bytes. Properties (abort on violation; ASan/UBSan catch the rest):
//   - the sessions' pending waits always add up to the state's pending_waits();
//   - stored_bytes() never underflows (it stays below a bound derived from the input size);
//   - a session never leaves unconsumed bytes that form a whole request;
//   - session 1's chunks change no key (count or bytes) while it has not proved the secret as an agent;
//   - both worlds give the same reply bytes and drop a client at the same moment;
//   - the ledger counts exactly the distinct buffers the sharing world's queues reference;
//   - once every session is destroyed, the state has no pending wait and no watch left, and the ledger is
//     empty.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "rendezvous/store/key_value_state.h"
#include "rendezvous/store/reply_queue.h"
#include "rendezvous/store/store_session.h"
#include "rendezvous/store/wire_codec.h"

namespace {

using ddprun::rdzv::Dialect;
using ddprun::rdzv::KeyValueState;
using ddprun::rdzv::ParseStatus;
using ddprun::rdzv::ReplyQueue;
using ddprun::rdzv::Request;
using ddprun::rdzv::RequestParser;
using ddprun::rdzv::SharedBytes;
using ddprun::rdzv::StoreSession;
using ddprun::rdzv::WireLimits;

// Deterministic and learnable: the fuzzer only has to copy bytes to pass AUTH.
class FuzzAuth final : public ddprun::rdzv::StoreAuth {
 public:
  explicit FuzzAuth(bool blocking) : blocking_(blocking) {}
  bool blocks() const noexcept override { return blocking_; }
  std::string nonce() const noexcept override { return std::string(kNonceBytes, 'N'); }
  std::string proof(std::string_view role, std::string_view client_nonce,
                    std::string_view store_nonce) const override {
    return std::string(role.substr(0, 1)) + std::string(client_nonce.substr(0, 4)) +
           std::string(store_nonce.substr(0, 4));
  }
  bool verify(std::string_view role, std::string_view client_nonce, std::string_view store_nonce,
              std::string_view given, std::string& why) const noexcept override {
    if (given == proof(role, client_nonce, store_nonce)) return true;
    why = "a wrong proof";
    return false;
  }
  std::string what() const override { return "the fuzzer's proof"; }

 private:
  bool blocking_;
};

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_store_session: property violated: %s\n", what);
    std::abort();
  }
}

// One simulated connection: a session plus the bytes of its incomplete request.
struct Client {
  std::optional<Dialect> dialect;
  std::unique_ptr<StoreSession> session;
  std::vector<uint8_t> pending;
  size_t async_outputs = 0;
};

// One store and its two connections. `share_at` SIZE_MAX: every value copied into the replies.
class World {
 public:
  World(const WireLimits& limits, size_t max_output, size_t share_at, uint8_t config, bool blocking_auth)
      : limits_(limits), max_output_(max_output), share_at_(share_at), blocking_auth_(blocking_auth) {
    for (int i = 0; i < 2; ++i) {
      uint8_t d = (config >> (2 * i)) & 3;
      if (d != 3) clients_[i].dialect = static_cast<Dialect>(d);
      connect(i);
    }
  }

  ~World() {
    for (auto& c : clients_) c.session.reset();
    check(state_.pending_waits() == 0, "pending waits left after every session ended");
    check(state_.watches() == 0, "watches left after every session ended");
    check(ledger_.bytes() == 0 && ledger_.buffers() == 0, "shared buffers counted after every session ended");
  }

  // Returns whether the client was dropped (and replaced).
  bool feed(int i, std::span<const uint8_t> chunk) {
    Client& c = clients_[i];
    c.pending.insert(c.pending.end(), chunk.begin(), chunk.end());
    const bool stranger = i == 1 && !c.session->agent();
    const int64_t keys_before = state_.num_keys();
    const size_t bytes_before = state_.stored_bytes();
    auto result = c.session->consume(c.pending, max_output_);
    // A blocking AUTH step: run it (here, at once) and give its outcome back, then the bytes after it.
    while (result.error.empty() && result.auth_pending) {
      check(result.consumed <= c.pending.size(), "consumed more than given");
      auto done = c.session->finish_auth(c.session->take_auth_step().run());
      if (!done.error.empty()) {
        result = done;
        break;
      }
      c.pending.erase(c.pending.begin(), c.pending.begin() + static_cast<ptrdiff_t>(result.consumed));
      result = c.session->consume(c.pending, max_output_);
    }
    check(result.consumed <= c.pending.size(), "consumed more than given");
    if (stranger && !c.session->agent()) {
      check(state_.num_keys() == keys_before && state_.stored_bytes() == bytes_before,
            "a client that did not prove the secret changed the store");
    }
    if (!result.error.empty()) {
      disconnect(i);  // the server drops the client
      return true;
    }
    c.pending.erase(c.pending.begin(), c.pending.begin() + static_cast<ptrdiff_t>(result.consumed));
    // What is left must be an incomplete request: parse it with the session's dialect.
    if (!c.pending.empty() && c.session->dialect()) {
      RequestParser p(limits_, c.session->dialect());
      Request r;
      check(p.parse(c.pending, r).status == ParseStatus::kNeedMore, "a whole request was left unconsumed");
    }
    if (c.session->output().size() > max_output_) {  // the server's max_output_bytes
      disconnect(i);
      return true;
    }
    return false;
  }

  void disconnect(int i) {
    clients_[i].session.reset();
    clients_[i].pending.clear();
    connect(i);
  }

  const ReplyQueue& output(int i) const { return clients_[i].session->output(); }
  void drain(int i) { clients_[i].session->output().clear(); }

  void check_invariants(size_t input_size) const {
    size_t waits = 0;
    for (const auto& c : clients_) waits += c.session->pending_waits();
    check(waits == state_.pending_waits(), "session waits and state waits disagree");
    // Every stored byte came from the input, except ADD's decimal digits (at most 20 per 9 input bytes).
    check(state_.stored_bytes() <= 4 * input_size + 64, "stored_bytes underflowed or is inflated");
    if (clients_[0].session->output().pieces() + clients_[1].session->output().pieces() <= 1024) {
      check_ledger();  // cheap enough after every record; long queues are checked at the end
    }
  }

  void check_ledger() const {
    std::unordered_set<const std::string*> seen;
    size_t shared = 0;
    for (const auto& c : clients_) {
      const ReplyQueue& out = c.session->output();
      check(out.owned_bytes() <= out.size(), "a queue owns more bytes than it holds");
      out.for_each_shared([&](const std::string& b) {
        if (seen.insert(&b).second) shared += b.size();
      });
    }
    check(ledger_.buffers() == seen.size() && ledger_.bytes() == shared,
          "the ledger disagrees with the buffers the queues reference");
  }

 private:
  void connect(int i) {
    Client& c = clients_[i];
    c.session = std::make_unique<StoreSession>(
        state_, limits_, c.dialect, [&c] { ++c.async_outputs; }, &ledger_, share_at_);
    if (i == 1) {
      c.session->set_admission(
          {.auth = std::make_shared<FuzzAuth>(blocking_auth_), .peer_admitted = [] { return false; }});
    }
  }

  WireLimits limits_;
  size_t max_output_;
  size_t share_at_;
  bool blocking_auth_;
  SharedBytes ledger_;   // declared before the state and the clients: the queues release into it last
  KeyValueState state_;  // declared before the clients: the sessions must end first
  Client clients_[2];
};

class Harness {
 public:
  explicit Harness(uint8_t config)
      : limits_(limits_for(config)),
        sharing_(limits_, max_output(config), size_t{1} + 8 * (config >> 6), config, /*blocking_auth=*/true),
        copying_(limits_, max_output(config), SIZE_MAX, config, /*blocking_auth=*/false) {}

  void feed(int i, std::span<const uint8_t> chunk) {
    const bool a = sharing_.feed(i, chunk), b = copying_.feed(i, chunk);
    check(a == b, "the sharing and the copying store dropped a client at different moments");
    check(sharing_.output(i).size() == copying_.output(i).size(), "shared and copied replies differ in size");
  }
  void disconnect(int i) {
    sharing_.disconnect(i);
    copying_.disconnect(i);
  }
  void drain(int i) {
    same_output(i);
    sharing_.drain(i);
    copying_.drain(i);
  }
  void check_invariants(size_t input_size) const {
    sharing_.check_invariants(input_size);
    copying_.check_invariants(input_size);
  }
  // At the end of the input: what is still queued must be the same bytes too.
  void finish() {
    for (int i = 0; i < 2; ++i) same_output(i);
    sharing_.check_ledger();
  }

 private:
  static WireLimits limits_for(uint8_t config) {
    WireLimits limits;
    if (config & 0x10) {
      limits.max_key_bytes = 16;
      limits.max_value_bytes = 64;
      limits.max_keys_per_request = 4;
      limits.max_request_bytes = 200;
      limits.max_pending_waits = 4;  // the per-connection caps are reached within a few requests
      limits.max_watched_keys = 4;
    }
    return limits;
  }
  static size_t max_output(uint8_t config) { return (config & 0x20) ? 256 : 1 << 20; }

  void same_output(int i) const {
    const ReplyQueue &a = sharing_.output(i), &b = copying_.output(i);
    check(a.size() == b.size() && b.owned_bytes() == b.size(), "the copying store shared, or sizes differ");
    check(a.flatten() == b.flatten(), "shared and copied replies differ");
  }

  WireLimits limits_;
  World sharing_;
  World copying_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Harness h(data[0]);
  size_t pos = 1;
  while (pos < size) {
    uint8_t header = data[pos++];
    if (header >= 0xF0) {
      if (header <= 0xF1) {
        h.disconnect(header & 1);
      } else if (header <= 0xF3) {
        h.drain(header & 1);
      }
    } else {
      size_t len = std::min<size_t>(header >> 1, size - pos);
      h.feed(header & 1, std::span<const uint8_t>(data + pos, len));
      pos += len;
    }
    h.check_invariants(size);
  }
  h.finish();
  return 0;
}
