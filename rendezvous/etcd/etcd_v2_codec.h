// etcd's v2 keys API as text, without sockets: request targets and form bodies (percent-encoded), and what a
// reply means (a Response, an etcd error, a member without a leader, not etcd at all). EtcdClient
// (etcd_client.h) sends and receives; this decides. Pure functions, thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "rendezvous/etcd/etcd_client.h"

namespace ddprun::rdzv::etcd::v2 {

// "/" + key when key does not start with '/'.
std::string normalized_key(const std::string& key);

// "/v2/keys" + the key, its bytes outside [A-Za-z0-9-._~/] percent-encoded ("%2F" never: '/' stays).
std::string keys_path(const std::string& normalized);

// "name=value&..." with every byte outside [A-Za-z0-9-._~] percent-encoded: a query string, or an
// application/x-www-form-urlencoded body.
class Form {
 public:
  Form& add(std::string_view name, std::string_view value);
  Form& add_flag(std::string_view name, bool value) { return add(name, value ? "true" : "false"); }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// The request a reply answers, for messages.
struct RequestText {
  std::string method;  // "GET"
  std::string target;  // "/v2/keys/a?recursive=true"
  std::string key;     // "/a" (normalized, not encoded)
  std::string member;  // "host:port"
};

// A reply as HTTP delivered it.
struct Reply {
  unsigned status = 0;
  std::string_view body;
  std::optional<std::string_view> etcd_index;  // the X-Etcd-Index header
};

// What `reply` says:
//   a Response (2xx with etcd's {"action":..,"node":..});
//   nullopt with `leaderless` set to why, for etcd error codes 300-302 (no leader): ask another member;
// and throws EtcdKeyError for any other etcd error document (the key, etcd's message and cause, the code),
// EtcdProtocolError for a 404 that is not etcd's (the --enable-v2=true hint) and for anything else that is
// not what etcd sends (the member, the request, the key, the HTTP status, the start of the body).
std::optional<Response> read_reply(const Reply& reply, const RequestText& request, std::string& leaderless);

// A watch's reply that ended without an event: etcd answers 200 with an empty body when it drops a watch.
bool is_empty_watch_reply(const Reply& reply);

}  // namespace ddprun::rdzv::etcd::v2
