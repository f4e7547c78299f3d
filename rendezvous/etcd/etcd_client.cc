// EtcdClient's two policies over MemberConnection (member_connection.h, the HTTP to one member): the request
// policy (get, write, remove: member failover) and the watch policy (a long poll with its own deadline).
#include "rendezvous/etcd/etcd_client.h"

#include <algorithm>
#include <stdexcept>
#include <thread>
#include <utility>

#include "rendezvous/etcd/etcd_v2_codec.h"
#include "rendezvous/etcd/member_connection.h"
#include "rendezvous/util/duration_text.h"

namespace ddprun::rdzv::etcd {
namespace {

using Clock = std::chrono::steady_clock;
using Outcome = MemberConnection::Outcome;

constexpr auto kWatchRetryPause = std::chrono::milliseconds(100);  // a watch asks again at most this often
constexpr auto kRetryPause = std::chrono::milliseconds(200);  // between two rounds of the members (no answer)

// One request as the caller made it.
struct Call {
  MemberConnection::Request http;
  std::string key;  // normalized, unencoded: for messages
};

// A request for `key`, with `query` (may be empty) in the target and `body` (a form) in the request.
Call call_for(std::string method, const std::string& key, const v2::Form& query, std::string body = "") {
  Call call;
  call.key = v2::normalized_key(key);
  call.http.method = std::move(method);
  call.http.target = v2::keys_path(call.key);
  if (!query.text().empty()) call.http.target += "?" + query.text();
  call.http.body = std::move(body);
  return call;
}

// The members' failures in the current round of the list, for messages ("host:port: why; host:port: why").
class Failures {
 public:
  void add(const std::string& member, const std::string& why, bool tls) {
    each_.push_back(member + ": " + why);
    tls_ = tls_ || tls;
  }
  std::size_t count() const { return each_.size(); }
  std::string text() const {
    std::string text;
    for (const auto& f : each_) text += (text.empty() ? "" : "; ") + f;
    return text;
  }
  // A new round. A TLS failure stays known for the rest of the call.
  void clear() { each_.clear(); }
  // Throws EtcdTlsError naming every failure when one of the call's failures was a TLS one.
  void throw_if_tls() const {
    if (tls_) throw EtcdTlsError("no etcd member answered over TLS: " + text());
  }

 private:
  std::vector<std::string> each_;
  bool tls_ = false;
};

}  // namespace

struct Client::Impl {
  explicit Impl(const ClientOptions& options) : options(options), connection(options) {}

  std::string member_text(std::size_t i) const { return options.endpoints[i].to_string(); }
  std::size_t next(std::size_t member) const { return (member + 1) % options.endpoints.size(); }

  // Shared by both policies: what member `i` made of `call`. Returns etcd's response, `i` now the member that
  // answered last; nullopt with the failure added when the member failed or answered that etcd has no leader
  // (errors 300-302, v2::read_reply). Throws EtcdKeyError for etcd's other error documents,
  // EtcdProtocolError for a reply that is not etcd's.
  std::optional<Response> response_of(std::size_t i, const Call& call, const Outcome& outcome,
                                      Failures& failures) {
    if (outcome.kind != Outcome::kReply) {
      failures.add(member_text(i), outcome.failure, outcome.kind == Outcome::kTlsFailed);
      return std::nullopt;
    }
    const v2::Reply reply{outcome.status, outcome.body, outcome.etcd_index};
    const v2::RequestText request{call.http.method, call.http.target, call.key, member_text(i)};
    std::string leaderless;
    auto response = v2::read_reply(reply, request, leaderless);
    current = i;
    if (!response) failures.add(member_text(i), leaderless, false);
    return response;
  }

  // The request policy (get, write, remove). `call` goes to the member that answered last, then round the
  // list: a member that cannot be reached, is silent for the request timeout, closes the connection, or
  // answers that etcd has no leader passes it to the next one. When every member failed once, the list is
  // tried again every 200 ms (a leader election takes about a second) while the request timeout since the
  // call began lasts. Returns etcd's response. Throws what response_of throws; EtcdTlsError when every
  // member failed, one of them over TLS; else, at the end, EtcdUnavailableError naming each member and what
  // went wrong in the last round.
  Response request(const Call& call) {
    const auto started = Clock::now();
    Failures failures;
    bool again = false;  // a round after every member had failed once
    for (std::size_t member = current;; member = next(member)) {
      const Outcome outcome = connection.exchange(member, call.http);
      if (auto response = response_of(member, call, outcome, failures)) return *std::move(response);
      if (failures.count() < options.endpoints.size()) continue;
      failures.throw_if_tls();
      if (Clock::now() + kRetryPause >= started + options.request_timeout) {
        throw EtcdUnavailableError(
            (again ? "no etcd member answered within " + duration_text(options.request_timeout) + ": "
                   : std::string("no etcd member answered: ")) +
            failures.text());
      }
      again = true;
      failures.clear();
      std::this_thread::sleep_for(kRetryPause);
    }
  }

  // The watch policy. Long-polls `call` from the member that answered last until etcd reports a change (the
  // response) or `timeout` passes with a member there to say that nothing changed (nullopt). A member that
  // ends the poll without an event (an empty reply, a connection closed after the header) is asked again,
  // the next one after a closed connection: not more than ten times a second. A member that fails passes
  // the watch to the next one. A round in which every member failed throws EtcdUnavailableError ("no etcd
  // member answered: ...") when no member answered the watch yet; after one did, the rounds go on (ten a
  // second at most) until the timeout, and then EtcdUnavailableError names the failures since the last
  // answer ("no etcd member answered within the watch's 1.5 s: ..."). Throws what response_of throws, and
  // EtcdTlsError when every member of a round failed after one of the watch's failures was a TLS one.
  std::optional<Response> watch(const Call& call, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    Failures failures;        // in this round
    std::string unavailable;  // the last round in which every member failed
    bool answered = false;
    auto pause_from = [&](Clock::time_point started) {
      std::this_thread::sleep_until(std::min(started + kWatchRetryPause, deadline));
    };
    for (std::size_t member = current;;) {
      const auto started = Clock::now();
      const Outcome outcome = connection.exchange(member, call.http, deadline);
      const bool empty = outcome.kind == Outcome::kReply &&
                         v2::is_empty_watch_reply(v2::Reply{outcome.status, outcome.body, std::nullopt});
      if (empty || outcome.kind == Outcome::kCutShort) {  // the poll ended without an event: ask again
        current = member;
        answered = true;
        failures.clear();
        unavailable.clear();
        if (!empty) member = next(member);
        pause_from(started);
        if (Clock::now() >= deadline) return std::nullopt;
        continue;
      }
      if (outcome.kind == Outcome::kFailed && Clock::now() >= deadline) {  // the deadline ended the poll
        if (failures.count() == 0 && unavailable.empty()) return std::nullopt;
      } else if (auto response = response_of(member, call, outcome, failures)) {
        return response;
      }
      if (failures.count() >= options.endpoints.size()) {
        failures.throw_if_tls();
        if (!answered || Clock::now() >= deadline) {
          throw EtcdUnavailableError("no etcd member answered: " + failures.text());
        }
        unavailable = failures.text();
        failures.clear();
        pause_from(started);
      }
      if (Clock::now() >= deadline) {
        if (failures.count() == 0 && unavailable.empty()) return std::nullopt;
        const std::string last = failures.text();
        throw EtcdUnavailableError("no etcd member answered within the watch's " + duration_text(timeout) +
                                   ": " + unavailable + (unavailable.empty() || last.empty() ? "" : "; ") +
                                   last);
      }
      member = next(member);
    }
  }

  const ClientOptions& options;  // the Client's
  MemberConnection connection;
  std::size_t current = 0;  // the member that answered last
};

Client::Client(ClientOptions options) : options_(std::move(options)) {
  if (options_.endpoints.empty()) throw std::invalid_argument("etcd client: no endpoints given");
  impl_ = std::make_unique<Impl>(options_);
}

Client::~Client() = default;

std::string Client::current_endpoint() const {
  return impl_->member_text(impl_->current);
}

std::string Client::endpoints_text() const {
  std::string text;
  for (const auto& e : options_.endpoints) text += (text.empty() ? "" : ",") + e.to_string();
  return text;
}

Response Client::get(const std::string& key, const GetOptions& options) {
  v2::Form query;
  if (options.recursive) query.add_flag("recursive", true);
  if (options.quorum) query.add_flag("quorum", true);
  return impl_->request(call_for("GET", key, query));
}

Response Client::write(const std::string& key, const std::string& value, const WriteOptions& options) {
  v2::Form form;
  if (!options.dir && !options.refresh) form.add("value", value);
  if (options.dir) form.add_flag("dir", true);
  if (options.refresh) form.add_flag("refresh", true);
  if (options.ttl) form.add("ttl", std::to_string(*options.ttl));
  if (options.prev_exist) {
    form.add_flag("prevExist", *options.prev_exist);
  } else if (options.refresh) {
    form.add_flag("prevExist", true);  // a refresh of a key that is gone fails (100) rather than creating it
  }
  if (options.prev_value) form.add("prevValue", *options.prev_value);
  if (options.prev_index) form.add("prevIndex", std::to_string(*options.prev_index));
  return impl_->request(call_for("PUT", key, v2::Form(), form.text()));
}

Response Client::remove(const std::string& key, const DeleteOptions& options) {
  v2::Form query;
  if (options.prev_value) query.add("prevValue", *options.prev_value);
  if (options.prev_index) query.add("prevIndex", std::to_string(*options.prev_index));
  if (options.dir) query.add_flag("dir", true);
  if (options.recursive) query.add_flag("recursive", true);
  return impl_->request(call_for("DELETE", key, query));
}

std::optional<Response> Client::watch(const std::string& key, uint64_t wait_index, bool recursive,
                                      std::chrono::milliseconds timeout) {
  v2::Form query;
  query.add_flag("wait", true);
  if (wait_index > 0) query.add("waitIndex", std::to_string(wait_index));
  if (recursive) query.add_flag("recursive", true);
  return impl_->watch(call_for("GET", key, query), timeout);
}

}  // namespace ddprun::rdzv::etcd
