#include "rendezvous/store/store_session.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <utility>

#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

StoreSession::StoreSession(KeyValueState& state, WireLimits limits, std::optional<Dialect> dialect,
                           std::function<void()> on_async_output, SharedBytes* ledger, size_t share_at)
    : state_(state),
      parser_(limits, dialect),
      on_async_output_(std::move(on_async_output)),
      out_(ledger, share_at) {}

StoreSession::~StoreSession() {
  state_.release_owner(owner_id());
  for (auto id : waits_) state_.cancel_wait(id);
  for (const auto& [key, id] : watches_) state_.unwatch(id);
  if (bound_) state_.unbind_keyspace(prefix_);
}

void StoreSession::bind() {
  if (bound_) return;
  prefix_ = state_.bind_keyspace();
  bound_ = true;
}

void StoreSession::scope(Request& req) {
  bool agent_key = false;
  for (auto& k : req.keys) {
    if (k.starts_with(KeyValueState::kAgentNamespace)) {
      agent_key = true;
      continue;
    }
    bind();
    if (view_ == View::kUndecided) view_ = View::kKeyspace;
    if (!prefix_.empty()) k.insert(0, prefix_);
  }
  if (agent_key && view_ == View::kUndecided) view_ = View::kWholeStore;
  if ((req.op == Op::kGetNumKeys || req.op == Op::kListKeys) && view_ == View::kUndecided) {
    bind();  // a worker asking before it named a key: its keyspace, not the agents' keys
    view_ = View::kKeyspace;
  }
}

int64_t StoreSession::count_view() const {
  return view_ == View::kWholeStore ? state_.num_keys() : state_.count_keys(prefix_);
}

std::vector<std::string> StoreSession::list_view() const {
  return view_ == View::kWholeStore ? state_.list_keys() : state_.list_keys(prefix_);
}

std::string_view StoreSession::unscoped(const std::string& key) const {
  std::string_view k = key;
  if (!prefix_.empty() && k.starts_with(prefix_)) k.remove_prefix(prefix_.size());
  return k;
}

StoreSession::ConsumeResult StoreSession::consume(std::span<const uint8_t> input, size_t max_output) {
  ConsumeResult result;
  if (auth_phase_ != 0) return result;  // waits for finish_auth()
  while (result.consumed < input.size()) {
    ParseResult parsed = parser_.parse(input.subspan(result.consumed), scratch_);
    if (parsed.status == ParseStatus::kNeedMore) break;
    if (parsed.status == ParseStatus::kError) {
      result.error = std::move(parsed.error);
      break;
    }
    result.consumed += parsed.consumed;
    ++result.requests;
    ++result.by_op[static_cast<size_t>(scratch_.op)];
    if (std::string err = handle(scratch_, max_output); !err.empty()) {
      result.error = std::move(err);
      result.refused = refused_;
      break;
    }
    if (auth_phase_ != 0) {
      if (pending_auth_.auth->blocks()) {
        result.auth_pending = true;
        break;
      }
      if (std::string err = complete_auth(take_auth_step().run()); !err.empty()) {
        result.error = std::move(err);
        result.refused = refused_;
        break;
      }
    }
    if (out_.size() > max_output) {
      result.error = "not reading its replies (" + std::to_string(out_.size()) +
                     " bytes queued, the limit is " + std::to_string(max_output) + ")";
      break;
    }
  }
  return result;
}

StoreSession::ConsumeResult StoreSession::finish_auth(AuthOutcome outcome) {
  ConsumeResult result;
  result.error = complete_auth(outcome);
  result.refused = refused_;
  return result;
}

void StoreSession::handle_wait(const std::vector<std::string>& keys) {
  // The id is only known after wait() returns, so the callback finds itself through a shared slot.
  auto self_id = std::make_shared<KeyValueState::HandleId>(0);
  auto id = state_.wait(keys, [this, self_id] {
    waits_.erase(*self_id);
    out_.u8(kWaitStopWaiting);
    if (on_async_output_) on_async_output_();
  });
  if (!id) {
    out_.u8(kWaitStopWaiting);
    return;
  }
  *self_id = *id;
  waits_.insert(*id);
}

namespace {

// What an observer (`ddprun status`) may do: read.
bool reads_only(Op op) {
  switch (op) {
    case Op::kValidate:
    case Op::kPing:
    case Op::kGet:
    case Op::kCheck:
    case Op::kWait:
    case Op::kCancelWait:
    case Op::kMultiGet:
    case Op::kGetNumKeys:
    case Op::kListKeys:
    case Op::kQueueLen:
      return true;
    default:
      return false;
  }
}

}  // namespace

std::string StoreSession::admit(const Request& req) {
  if (!admission_.auth || role_ == Role::kAgent) return "";
  if (req.op == Op::kValidate || req.op == Op::kPing || req.op == Op::kAuth) return "";
  if (role_ == Role::kObserver) {
    if (reads_only(req.op) || (req.op == Op::kAdd && req.delta == 0)) return "";  // ADD 0: a counter read
    return "refused " + std::string(op_name(req.op)) +
           ": an observer (ddprun status) proved the job's secret to read, not to write";
  }
  if (!admitted_) {
    if (!admission_.peer_admitted || !admission_.peer_admitted()) {
      return "refused " + std::string(op_name(req.op)) + ": this store requires " + admission_.auth->what() +
             ", and the client is neither an authenticated agent nor on a node of the job";
    }
    admitted_ = true;  // latched: the connection stays admitted while its node's agent reconnects
  }
  for (const auto& k : req.keys) {
    if (k.starts_with(KeyValueState::kAgentNamespace)) {
      return "refused " + std::string(op_name(req.op)) + " on '" + k +
             "': the job's own keys need an agent that proved " + admission_.auth->what();
    }
  }
  return "";
}

StoreSession::AuthOutcome StoreSession::AuthStep::run() const noexcept {
  AuthOutcome out;
  try {
    if (phase == 1) {
      out.proof = auth->proof(StoreAuth::kStore, client_nonce, store_nonce);
      out.ok = true;
    } else {
      out.ok = auth->verify(phase == 2 ? StoreAuth::kAgent : StoreAuth::kObserver, client_nonce, store_nonce,
                            given, out.why);
    }
  } catch (const std::exception& e) {  // proof() could not be made (munged down), or no memory
    out.ok = false;
    out.why = e.what();
  }
  return out;
}

std::string StoreSession::start_auth(const Request& req) {
  const StoreAuth* auth = admission_.auth.get();
  if (req.number == 1 && !auth) {  // an open store: no proof to give or take
    out_.bytes(std::string());
    out_.bytes(std::string());
    return "";
  }
  if (!auth) return "AUTH phase " + std::to_string(req.number) + " on a store without a secret";
  if (authenticated()) return "AUTH on a connection that already proved " + auth->what();
  if (req.number == 1) {
    if (!store_nonce_.empty()) return "AUTH phase 1 twice";
    if (req.values[0].size() != StoreAuth::kNonceBytes) {
      return "AUTH with a nonce of " + std::to_string(req.values[0].size()) + " bytes (" +
             std::to_string(StoreAuth::kNonceBytes) + " expected)";
    }
    store_nonce_ = auth->nonce();
    if (store_nonce_.empty()) {
      refused_ = true;
      return "AUTH: this store has no random bytes for its nonce (the system's random source failed)";
    }
    client_nonce_ = req.values[0];
  } else if (req.number == 2 || req.number == 3) {
    if (store_nonce_.empty()) return "AUTH phase " + std::to_string(req.number) + " before phase 1";
  } else {
    return "AUTH with an unknown phase " + std::to_string(req.number);
  }
  auth_phase_ = req.number;
  pending_auth_ = AuthStep{.auth = admission_.auth,
                           .phase = req.number,
                           .client_nonce = client_nonce_,
                           .store_nonce = store_nonce_,
                           .given = req.number == 1 ? std::string() : req.values[0]};
  return "";
}

std::string StoreSession::complete_auth(const AuthOutcome& outcome) {
  const uint32_t phase = std::exchange(auth_phase_, 0);
  pending_auth_ = AuthStep{};
  if (phase == 0) return "an AUTH outcome without an AUTH request";
  if (phase == 1) {
    if (!outcome.ok) {
      refused_ = true;
      return "AUTH: this store cannot prove itself to the agent: " + outcome.why;
    }
    out_.bytes(store_nonce_);
    out_.bytes(outcome.proof);
    return "";
  }
  if (!outcome.ok) {
    refused_ = true;
    return "refused AUTH" + std::string(phase == 3 ? " of an observer" : "") + ": " + outcome.why;
  }
  role_ = phase == 2 ? Role::kAgent : Role::kObserver;
  established_ = true;
  out_.u8(1);
  if (role_ == Role::kAgent && admission_.on_authenticated) admission_.on_authenticated();
  return "";
}

std::string StoreSession::handle(Request& req, size_t max_output) {
  if (std::string why = admit(req); !why.empty()) {
    refused_ = true;
    return why;
  }
  if (req.op == Op::kAuth) return start_auth(req);
  if (req.op != Op::kValidate && req.op != Op::kPing) established_ = true;
  scope(req);
  return serve(req, max_output);
}

std::string StoreSession::serve(Request& req, size_t max_output) {
  ReplyQueue& w = out_;
  switch (req.op) {
    case Op::kValidate:
      break;  // the parser checked the magic; no reply
    case Op::kAuth:
      break;  // start_auth(), in handle()
    case Op::kPing:
      w.u32(req.number);
      break;
    case Op::kSet:
      if (KeyValueState::connection_bound(req.keys[0])) state_.bind_to_owner(req.keys[0], owner_id());
      state_.set(req.keys[0], std::move(req.values[0]));
      break;
    case Op::kCompareSet:
      w.bytes(state_.compare_set(req.keys[0], std::move(req.values[0]), std::move(req.values[1])));
      break;
    case Op::kGet:
      // Clients WAIT before GET; a GET of a missing key gets an empty value to keep the stream in step.
      w.bytes(state_.shared(req.keys[0]));
      break;
    case Op::kAdd:
      return serve_add(req);
    case Op::kCheck:
      w.u8(state_.check(req.keys) ? kCheckReady : kCheckNotReady);
      break;
    case Op::kWait:
      return serve_wait(req.keys);
    case Op::kGetNumKeys:
      w.i64(count_view());
      break;
    case Op::kDeleteKey:
      w.i64(state_.remove(req.keys[0]) ? 1 : 0);
      break;
    case Op::kAppend:
      state_.append(req.keys[0], req.values[0]);
      break;
    case Op::kMultiGet:
      return serve_multi_get(req, max_output);
    case Op::kMultiSet:
      for (size_t i = 0; i < req.keys.size(); ++i) state_.set(req.keys[i], std::move(req.values[i]));
      break;
    case Op::kCancelWait:
      // Cancels every pending WAIT of this connection. A WAIT that already fired sent its 0 before.
      for (auto id : waits_) state_.cancel_wait(id);
      waits_.clear();
      w.u8(kWaitCanceled);
      break;
    case Op::kQueuePush:
      state_.queue_push(req.keys[0], std::move(req.values[0]));
      break;
    case Op::kQueuePop:
      // Reply: the queue's length before the pop, then the element when there was one.
      w.i64(state_.queue_len(req.keys[0]));
      if (SharedValue v = state_.queue_pop(req.keys[0])) w.bytes(v);
      break;
    case Op::kListKeys:
      serve_list_keys();
      break;
    case Op::kQueueLen:
      w.i64(state_.queue_len(req.keys[0]));
      break;
    case Op::kWatchKey:
      return serve_watch(req.keys[0]);
  }
  return {};
}

std::string StoreSession::serve_add(const Request& req) {
  if (role_ == Role::kObserver) {  // ADD 0 as a read: a missing key is 0 and stays missing
    const std::string* text = state_.get(req.keys[0]);
    const std::optional<long long> v = text ? parse_int(*text) : std::optional<long long>(0);
    if (!v) return "ADD on key '" + req.keys[0] + "' whose value is not an integer";
    out_.i64(static_cast<int64_t>(*v));
    return {};
  }
  auto v = state_.add(req.keys[0], req.delta);
  if (!v) return "ADD on key '" + req.keys[0] + "' whose value is not an integer (or overflows)";
  out_.i64(*v);
  return {};
}

std::string StoreSession::serve_wait(const std::vector<std::string>& keys) {
  if (waits_.size() >= parser_.limits().max_pending_waits) {
    return "more than " + std::to_string(parser_.limits().max_pending_waits) +
           " WAITs pending on one connection (the limit)";
  }
  handle_wait(keys);
  return {};
}

std::string StoreSession::serve_multi_get(const Request& req, size_t max_output) {
  // One request may name a large value many times: size the reply before building it.
  size_t reply = 0;
  found_.clear();
  for (const auto& k : req.keys) {
    found_.push_back(&state_.shared(k));
    reply += sizeof(uint64_t) + (*found_.back() ? (*found_.back())->size() : 0);
  }
  if (reply > max_output - std::min(max_output, out_.size())) {
    return "MULTI_GET reply of " + std::to_string(reply) + " bytes is over the output limit of " +
           std::to_string(max_output);
  }
  for (const SharedValue* v : found_) out_.bytes(*v);
  return {};
}

void StoreSession::serve_list_keys() {
  const auto keys = list_view();
  out_.i64(static_cast<int64_t>(keys.size()));
  for (const auto& k : keys) out_.bytes(view_ == View::kKeyspace ? unscoped(k) : std::string_view(k));
}

std::string StoreSession::serve_watch(const std::string& key) {
  // Legacy callback connection: acknowledge, then push every change of the key. Once per key: a repeated
  // WATCH_KEY would multiply every notification (a few bytes making gigabytes of replies).
  out_.u8(static_cast<uint8_t>(WatchEvent::kCallbackRegistered));
  if (watches_.count(key)) return {};
  if (watches_.size() >= parser_.limits().max_watched_keys) {
    return "more than " + std::to_string(parser_.limits().max_watched_keys) +
           " keys watched on one connection (the limit)";
  }
  // The notification references the old and the new value: a hundred watchers cost them once.
  auto id = state_.watch(key, [this](WatchEvent event, const std::string& changed,
                                     const SharedValue& old_value, const SharedValue& new_value) {
    out_.u8(static_cast<uint8_t>(event));
    out_.bytes(unscoped(changed));
    out_.bytes(old_value);
    out_.bytes(new_value);
    if (on_async_output_) on_async_output_();
  });
  watches_.emplace(key, id);
  return {};
}

}  // namespace ddprun::rdzv
