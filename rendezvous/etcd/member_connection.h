// MemberConnection: EtcdClient's transport (etcd_client.h) — one HTTP/1.1 exchange at a time with one etcd
// member, over a keep-alive connection, HTTPS when the client's options say so. Boost.Beast does the HTTP,
// OpenSSL the TLS; every network step is an asynchronous operation run on this object's own io_context until
// it completes, and a deadline ends the step that outlives it (beast::tcp_stream's expires_at, a steady_timer
// for the resolver). Which member to ask and what a reply means is the client's business (etcd_client.cc).
//
// Connection: made at the first exchange with a member and kept for the next ones with it; an exchange with
// another member closes it and connects there; a reply without keep-alive closes it. A kept connection that
// the member had closed meanwhile (it fails before any byte of the reply) is replaced once by a fresh one,
// within the same exchange.
//
// Deadlines of one try: resolving, connecting, the TLS handshake, sending the request and receiving the
// reply's header by the request timeout from the try's start (or by `long_poll_until` when that is earlier);
// the reply's body by `long_poll_until` when given (a watch), else by the header's deadline. exchange()
// returns within two tries.
//
// Threads: not thread-safe; one exchange at a time. The destructor closes the connection.
// Errors: exchange() reports every failure in its Outcome and throws nothing but std::bad_alloc; the
// constructor throws EtcdTlsError when a PEM file given cannot be read or is not usable.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "rendezvous/etcd/etcd_client.h"

namespace ddprun::rdzv::etcd {

class MemberConnection {
 public:
  using Clock = std::chrono::steady_clock;

  struct Request {
    std::string method;  // "GET", "PUT" or "DELETE"
    std::string target;  // "/v2/keys/<encoded key>?query"
    std::string body;    // a form, for PUT
  };

  // What one exchange came to.
  struct Outcome {
    enum Kind {
      kReply,      // a whole HTTP reply: status, body, etcd_index
      kFailed,     // the member cannot be resolved or reached, was silent past a deadline, or closed the
                   // connection before the reply's header
      kTlsFailed,  // the TLS handshake or the TLS layer failed (OpenSSL's reason; a hint when the member
                   // seems to refuse the client's certificate)
      kCutShort,   // the member closed the connection after the reply's header (it ended a long poll)
    };
    Kind kind = kReply;
    unsigned status = 0;
    std::string body;
    std::optional<std::string> etcd_index;  // the X-Etcd-Index header
    std::string failure;  // why, a clause for messages: "connection refused", "no answer within 5 s"
  };

  // Keeps a copy of `options` (members, TLS, request timeout). Connects nothing yet.
  explicit MemberConnection(const ClientOptions& options);
  ~MemberConnection();
  MemberConnection(const MemberConnection&) = delete;
  MemberConnection& operator=(const MemberConnection&) = delete;

  // Sends `request` to options.endpoints[member] and reads the reply, within the deadlines above.
  Outcome exchange(std::size_t member, const Request& request,
                   std::optional<Clock::time_point> long_poll_until = std::nullopt);
  // Closes the kept connection, if any; the next exchange connects again.
  void close();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ddprun::rdzv::etcd
