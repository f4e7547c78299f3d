// One client's conversation with the store: request bytes in, reply bytes out.
//
// Pure protocol logic with no sockets, so the server, the tests and the fuzzer share it. Single-threaded:
// the session and its KeyValueState must only be touched from one thread (the server's io_context).
// Ownership: the session references `state` and must not outlive it; its destructor cancels the session's
// pending waits and watches, so a vanished client leaves nothing behind.
//
// Keyspaces: the first request that names a worker key (one outside "/ddprun/") binds the session to the
// state's current worker keyspace (KeyValueState); from then on its worker keys are scoped to it, and the
// keys it gets back (LIST_KEYS, WATCH_KEY events) are shown without the prefix. Transparent to the client.
// GETNUMKEYS and LIST_KEYS answer from one view per session, decided by its first request that names a key
// or asks for them: a worker key, GETNUMKEYS or LIST_KEYS first binds the session and its view is its
// keyspace (the whole store when no keyspace was ever named); agent keys ("/ddprun/...") first make it an
// agent's session, whose view is the whole store for good (docs/wire-protocol.md, "Worker keyspaces").
//
// Admission (docs/security.md): with a StoreAuth (set_admission), a session that proved the job's secret as
// an agent (AUTH phase 2, store_auth.h) may do everything; one that proved it as an observer (phase 3:
// `ddprun status`) may read every key (GET, CHECK, MULTI_GET, WAIT, GETNUMKEYS, LIST, QUEUE_LEN) and write
// none (ADD 0 is served as a read of the counter), and does not make its address admitted. Before that, only
// VALIDATE, PING and AUTH are served, and — when its peer is admitted (a node of the job: an address with an
// authenticated agent connection, or the store's own host) — requests on worker keys; the first such request
// latches the session as admitted, so that an agent's connections that reconnect for a moment do not take its
// node's workers with them. A request that names an agent key ("/ddprun/...", the rendezvous, its stop key,
// the status) or comes from any other address is refused: consume() sets `refused` with the error and the
// session must be dropped. Without a StoreAuth the store is open (everything is served, as torch's TCPStore
// serves it) and AUTH phase 1 is answered with two empty values.
//
// AUTH off the session's thread: when the StoreAuth blocks (StoreAuth::blocks(): MUNGE, a round trip to
// munged), consume() stops right after an AUTH request and sets `auth_pending`; the owner runs
// take_auth_step().run() on another thread, gives the outcome back with finish_auth() on the session's
// thread, and then consumes the bytes that followed. A non-blocking auth (HMAC) runs the same step inline.
//
// Established: a session is established (established()) once it proved the secret, or was served a request
// other than VALIDATE, PING and AUTH (with a secret: was admitted). The server gives sessions that are not
// established a deadline and reclaims them first (StoreServerOptions::handshake_timeout).
//
// Connection-bound keys: an agent key with a "/live/" component that this session SET is removed when the
// session ends (KeyValueState::connection_bound).
//
// Limits per session (WireLimits::max_pending_waits, max_watched_keys): pending WAITs and watched keys. A
// client over one is broken: its request gets an error naming the limit and the session must be dropped
// (torch clients keep one WAIT pending at a time and watch a handful of keys).
//
// Replies accumulate in output(), a ReplyQueue: values of ReplyQueue::kShareAtBytes or more are referenced
// there, not copied (GET, MULTI_GET, COMPARE_SET, QUEUE_POP replies and WATCH_KEY notifications), and
// counted on the ledger given to the constructor. Most replies are produced by consume(); WAIT and WATCH_KEY
// replies can also be produced later, when another session writes a key: then `on_async_output` is called
// so the owner can start a write. A session never blocks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "rendezvous/store/key_value_state.h"
#include "rendezvous/store/reply_queue.h"
#include "rendezvous/store/store_auth.h"
#include "rendezvous/store/wire_codec.h"

namespace ddprun::rdzv {

class StoreSession {
 public:
  // `ledger` (may be null) counts the shared buffers output() references; it must outlive the session.
  StoreSession(KeyValueState& state, WireLimits limits, std::optional<Dialect> dialect,
               std::function<void()> on_async_output, SharedBytes* ledger = nullptr,
               size_t share_at = ReplyQueue::kShareAtBytes);
  ~StoreSession();
  StoreSession(const StoreSession&) = delete;
  StoreSession& operator=(const StoreSession&) = delete;

  struct ConsumeResult {
    size_t consumed = 0;  // bytes of input used by whole requests; the rest must be kept for later
    size_t requests = 0;  // how many requests were handled
    std::array<uint64_t, kOpCount> by_op{};  // of which, per operation (index: Op)
    std::string error;     // non-empty: the client is broken and must be dropped (message says why)
    bool refused = false;  // the error is a refusal by the store's admission (see the top of this file)
    // Stopped right after an AUTH request whose step blocks: run take_auth_step() off this thread, then
    // finish_auth(); `consumed` includes the AUTH request, the bytes after it are not handled yet.
    bool auth_pending = false;
  };

  // What an AUTH step does, copied out of the session so that it may run on any thread (see the top).
  struct AuthOutcome {
    bool ok = false;
    std::string proof;  // phase 1: the store's proof
    std::string why;    // !ok: what was wrong
  };
  struct AuthStep {
    std::shared_ptr<const StoreAuth> auth;
    uint32_t phase = 0;  // 1: make the store's proof; 2, 3: check the agent's, the observer's
    std::string client_nonce, store_nonce, given;
    // Runs the step: blocks when auth->blocks(). Never throws.
    AuthOutcome run() const noexcept;
  };

  // How this session admits its client (see the top of this file). Before the first request.
  struct Admission {
    std::shared_ptr<const StoreAuth> auth;   // null: an open store
    std::function<bool()> peer_admitted;     // the client's address is a node of the job
    std::function<void()> on_authenticated;  // the client proved the secret
  };
  void set_admission(Admission admission) {
    if (admission.auth && !admission.auth->store_requires()) admission.auth.reset();  // serves open
    admission_ = std::move(admission);
  }
  // Proved the secret, as an agent or as an observer; as an agent.
  bool authenticated() const { return role_ != Role::kNone; }
  bool agent() const { return role_ == Role::kAgent; }
  bool established() const { return established_; }
  // Handles every whole request at the front of `input`. `max_output`: the most reply bytes output() may
  // hold (its size(): shared values counted at their length, however cheap they are to queue); past it the
  // client is broken (error set) and the remaining requests are not handled, so that a few bytes of
  // pipelined GETs or one MULTI_GET cannot make a client owe gigabytes of replies.
  // While an AUTH step is pending nothing is consumed.
  ConsumeResult consume(std::span<const uint8_t> input, size_t max_output = SIZE_MAX);
  // With ConsumeResult::auth_pending: the step to run (once).
  AuthStep take_auth_step() { return std::exchange(pending_auth_, AuthStep{}); }
  // The pending step's outcome, on the session's thread: queues its reply. The result's error and refused
  // are as consume() reports them; then consume() the bytes that followed the AUTH request.
  ConsumeResult finish_auth(AuthOutcome outcome);

  // Pending reply bytes. The owner moves them out (swap) when it writes.
  ReplyQueue& output() { return out_; }
  const ReplyQueue& output() const { return out_; }
  std::optional<Dialect> dialect() const { return parser_.dialect(); }
  size_t pending_waits() const { return waits_.size(); }

 private:
  // Returns an error message when the request cannot be served; empty on success. The steps: admit(), AUTH's
  // start_auth(), scope(), then serve() the request (its serve_* helpers: the same contract).
  std::string handle(Request& req, size_t max_output);
  std::string serve(Request& req, size_t max_output);
  std::string serve_add(const Request& req);  // an observer's ADD 0 reads
  std::string serve_wait(const std::vector<std::string>& keys);
  std::string serve_multi_get(const Request& req, size_t max_output);
  void serve_list_keys();
  std::string serve_watch(const std::string& key);
  void handle_wait(const std::vector<std::string>& keys);
  // Empty when the request may be served to this client; else why it is refused. Latches the admission.
  std::string admit(const Request& req);
  // AUTH: checks the request and prepares its step in pending_auth_; the error when it is refused at once.
  std::string start_auth(const Request& req);
  // The step's outcome: its reply queued, or the error (a refusal).
  std::string complete_auth(const AuthOutcome& outcome);
  // Rewrites the request's worker keys into the session's keyspace (binding it on first use).
  void scope(Request& req);
  void bind();
  // This session as the owner of the connection-bound keys it SET (KeyValueState::connection_bound).
  uint64_t owner_id() const { return reinterpret_cast<uintptr_t>(this); }
  std::string_view unscoped(const std::string& key) const;
  // GETNUMKEYS and LIST_KEYS: how many keys, and which, this session's view holds.
  int64_t count_view() const;
  std::vector<std::string> list_view() const;

  KeyValueState& state_;
  RequestParser parser_;
  std::function<void()> on_async_output_;
  ReplyQueue out_;
  Request scratch_;
  std::vector<const SharedValue*> found_;              // MULTI_GET: each key's value (null: missing), reused
  std::unordered_set<KeyValueState::HandleId> waits_;  // pending WAITs
  std::unordered_map<std::string, KeyValueState::HandleId> watches_;  // legacy WATCH_KEY, by key
  bool bound_ = false;
  std::string prefix_;  // the bound keyspace's prefix ("" = unscoped)
  // What GETNUMKEYS and LIST_KEYS show, decided once (see the top of this file).
  enum class View { kUndecided, kKeyspace, kWholeStore };
  View view_ = View::kUndecided;
  Admission admission_;
  enum class Role { kNone, kAgent, kObserver };
  Role role_ = Role::kNone;   // what this session proved
  bool admitted_ = false;     // served by its address's admission once: stays so
  bool established_ = false;  // see the top of this file
  bool refused_ = false;
  std::string client_nonce_, store_nonce_;  // AUTH phase 1's, for phase 2
  uint32_t auth_phase_ = 0;                 // != 0: an AUTH step of this phase prepared, not finished
  AuthStep pending_auth_;                   // its data, until take_auth_step()
};

}  // namespace ddprun::rdzv
