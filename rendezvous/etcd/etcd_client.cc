// EtcdClient over Boost.Beast: every network step is an asynchronous operation run on the client's own
// io_context until it completes; beast::tcp_stream's deadline (expires_at) ends the step that outlives it
// with beast::error::timeout. The resolver has a steady_timer of its own.
#include "rendezvous/etcd/etcd_client.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <utility>

#include "rendezvous/etcd/etcd_v2_codec.h"

namespace ddprun::rdzv::etcd {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

constexpr unsigned kHttp11 = 11;
constexpr auto kWatchRetryPause = std::chrono::milliseconds(100);  // a watch asks again at most this often
constexpr auto kRetryPause = std::chrono::milliseconds(200);  // between two rounds of the members (no answer)
constexpr std::size_t kMaxReplyBytes = 256u << 20;                 // a recursive listing of a large tree

// "5 s", "1.5 s", "300 ms".
std::string duration_text(std::chrono::milliseconds d) {
  const auto ms = d.count();
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(ms) / 1000.0);
  return text;
}

// An error's text as a message's clause: "connection refused", not "Connection refused".
std::string error_text(const error_code& ec) {
  std::string text = ec.message();
  if (!text.empty() && text[0] >= 'A' && text[0] <= 'Z' &&
      (text.size() < 2 || !(text[1] >= 'A' && text[1] <= 'Z'))) {
    text[0] = static_cast<char>(text[0] - 'A' + 'a');
  }
  return text;
}

// OpenSSL's reason for a TLS failure; for a certificate that did not verify, the verifier's reason too.
std::string tls_reason(const error_code& ec, SSL* ssl) {
  std::string reason = ec.message();
  if (ssl != nullptr) {
    const long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK) reason += " (" + std::string(X509_verify_cert_error_string(verify)) + ")";
  }
  return reason;
}

// One request as the caller made it.
struct Call {
  http::verb method = http::verb::get;
  std::string key;     // normalized, unencoded: for messages
  std::string target;  // "/v2/keys/<encoded key>?query"
  std::string body;    // form, for PUT
  bool watch = false;
  Clock::time_point watch_deadline{};
  std::chrono::milliseconds watch_timeout{0};
};

// What one attempt on one member came to.
struct Attempt {
  enum Kind {
    kAnswer,         // an HTTP reply: `reply`
    kMemberFailed,   // unreachable, silent, closed: `failure`; the next member is tried
    kTlsFailed,      // the TLS handshake or the TLS layer failed: `failure`
    kWatchTimedOut,  // watch: nothing within its timeout
    kWatchEnded,     // watch: the member ended the reply without an event (empty body, idle close)
  };
  Kind kind = kAnswer;
  http::response<http::string_body> reply;
  std::string failure;
  bool stale = false;  // a kept connection the member had closed meanwhile
};

}  // namespace

struct Client::Impl {
  // One keep-alive connection to members[member].
  struct Connection {
    std::size_t member = 0;
    std::unique_ptr<beast::tcp_stream> plain;
    std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> tls;
    beast::flat_buffer buffer;
    bool reused = false;  // carried a request already: a failure before any reply byte may be a stale one
    beast::tcp_stream& tcp() { return tls ? beast::get_lowest_layer(*tls) : *plain; }
  };

  explicit Impl(const ClientOptions& options) : options(options) {
    if (options.https) ssl_context.emplace(make_ssl_context(options.tls));
  }

  static ssl::context make_ssl_context(const TlsFiles& files) {
    ssl::context ctx(ssl::context::tls_client);
    ctx.set_verify_mode(ssl::verify_peer);
    auto readable = [](const std::string& path, const char* what) {
      std::FILE* f = std::fopen(path.c_str(), "rb");
      if (f == nullptr) {
        throw EtcdTlsError(std::string("etcd TLS: cannot read the ") + what + " '" + path +
                           "': " + std::strerror(errno));
      }
      std::fclose(f);
    };
    auto load = [&](const std::string& path, const char* what, auto&& loader) {
      readable(path, what);
      error_code ec;
      loader(ec);
      if (ec)
        throw EtcdTlsError(std::string("etcd TLS: the ") + what + " '" + path +
                           "' is not usable: " + ec.message());
    };
    if (files.ca_file.empty()) {
      ctx.set_default_verify_paths();
    } else {
      load(files.ca_file, "CA file", [&](error_code& ec) { ctx.load_verify_file(files.ca_file, ec); });
    }
    if (!files.cert_file.empty()) {
      load(files.cert_file, "certificate file",
           [&](error_code& ec) { ctx.use_certificate_chain_file(files.cert_file, ec); });
      const std::string& key = files.key_file.empty() ? files.cert_file : files.key_file;
      load(key, "key file", [&](error_code& ec) { ctx.use_private_key_file(key, ssl::context::pem, ec); });
    } else if (!files.key_file.empty()) {
      throw EtcdTlsError("etcd TLS: a key file ('" + files.key_file + "') without a certificate file");
    }
    return ctx;
  }

  std::string member_text(std::size_t i) const { return options.endpoints[i].to_string(); }

  // Runs the io_context until every started operation completed (their deadlines bound that).
  void run() {
    ioc.restart();
    ioc.run();
  }

  void drop_connection() {
    if (!connection) return;
    error_code ignored;
    connection->tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
    connection->tcp().close();
    run();  // completes whatever the close cancelled
    connection.reset();
  }

  // Connects (and shakes hands) to member `i` by `deadline`; on failure returns the attempt that says why.
  std::optional<Attempt> connect(std::size_t i, Clock::time_point deadline) {
    const Endpoint& member = options.endpoints[i];
    tcp::resolver resolver(ioc);
    asio::steady_timer timer(ioc);
    error_code ec;
    tcp::resolver::results_type addresses;
    bool resolve_timed_out = false;
    timer.expires_at(deadline);
    timer.async_wait([&](const error_code& e) {
      if (!e) {
        resolve_timed_out = true;
        resolver.cancel();
      }
    });
    resolver.async_resolve(member.host, std::to_string(member.port),
                           [&](const error_code& e, tcp::resolver::results_type r) {
                             ec = e;
                             addresses = std::move(r);
                             timer.cancel();
                           });
    run();
    const std::string budget = duration_text(options.request_timeout);
    if (resolve_timed_out) return failed("cannot resolve the host within " + budget);
    if (ec) return failed("cannot resolve the host: " + error_text(ec));

    auto conn = std::make_unique<Connection>();
    conn->member = i;
    if (ssl_context) {
      conn->tls = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(ioc, *ssl_context);
    } else {
      conn->plain = std::make_unique<beast::tcp_stream>(ioc);
    }
    conn->tcp().expires_at(deadline);
    conn->tcp().async_connect(addresses, [&](const error_code& e, const tcp::endpoint&) { ec = e; });
    run();
    if (ec == beast::error::timeout) return failed("no connection within " + budget);
    if (ec) return failed(error_text(ec));
    if (conn->tls) {
      SSL* ssl = conn->tls->native_handle();
      if (!SSL_set_tlsext_host_name(ssl, member.host.c_str())) {
        return Attempt{Attempt::kTlsFailed, {}, "TLS: cannot set the server name '" + member.host + "'"};
      }
      conn->tls->set_verify_callback(ssl::host_name_verification(member.host));
      conn->tls->async_handshake(ssl::stream_base::client, [&](const error_code& e) { ec = e; });
      run();
      if (ec == beast::error::timeout) return failed("no TLS handshake within " + budget);
      if (ec && ec.category() == asio::error::get_ssl_category()) {
        return Attempt{Attempt::kTlsFailed, {}, "TLS handshake failed: " + tls_reason(ec, ssl)};
      }
      if (ec) {  // closed during the handshake: most likely not an https port
        return Attempt{Attempt::kTlsFailed,
                       {},
                       "TLS handshake failed: " + error_text(ec) + " (does the member serve https?)"};
      }
    }
    connection = std::move(conn);
    return std::nullopt;
  }

  // Why a member that asks for a client certificate may have refused this client.
  std::string client_certificate_hint() const {
    return options.tls.cert_file.empty()
               ? " (the member requires a client certificate: none was given)"
               : " (the member refused the client certificate '" + options.tls.cert_file + "')";
  }

  static Attempt failed(std::string why) { return Attempt{Attempt::kMemberFailed, {}, std::move(why)}; }

  // Writes the request and reads the reply on the current connection. The reply's header is due by
  // `header_deadline`, its body by `body_deadline` (later for a watch, which long-polls).
  template <class Stream>
  Attempt exchange(Stream& stream, http::request<http::string_body>& request, const Call& call,
                   Clock::time_point header_deadline, Clock::time_point body_deadline) {
    Connection& conn = *connection;
    const bool conn_tls = conn.tls != nullptr;
    const bool reused = conn.reused;
    conn.reused = true;
    const std::string budget = duration_text(options.request_timeout);
    error_code ec;
    conn.tcp().expires_at(header_deadline);
    http::async_write(stream, request, [&](const error_code& e, std::size_t) { ec = e; });
    run();
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxReplyBytes);
    if (!ec) {
      http::async_read_header(stream, conn.buffer, parser, [&](const error_code& e, std::size_t) { ec = e; });
      run();
    }
    if (!ec && !parser.is_done()) {
      conn.tcp().expires_at(body_deadline);
      http::async_read(stream, conn.buffer, parser, [&](const error_code& e, std::size_t) { ec = e; });
      run();
    }
    if (ec) {
      const bool header_read = parser.is_header_done();
      drop_connection();
      if (ec == beast::error::timeout) {
        if (call.watch && Clock::now() >= call.watch_deadline)
          return Attempt{Attempt::kWatchTimedOut, {}, {}};
        return failed("no answer within " + budget);
      }
      if (ec.category() == asio::error::get_ssl_category() && ec != ssl::error::stream_truncated) {
        std::string why = "TLS: " + error_text(ec);
        if (why.find("alert") != std::string::npos && why.find("certificate") != std::string::npos) {
          why += client_certificate_hint();
        }
        return Attempt{Attempt::kTlsFailed, {}, why};
      }
      const bool closed = ec == http::error::end_of_stream || ec == asio::error::eof ||
                          ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
                          ec == ssl::error::stream_truncated || ec == http::error::partial_message;
      if (closed && reused && !header_read) {
        return Attempt{Attempt::kMemberFailed, {}, "closed the connection", true};
      }
      if (closed && conn_tls && !header_read) {
        // TLS 1.3 checks the client's certificate after the client's handshake ended: a member that refuses
        // it sends an alert and closes, and the close (a reset, as the request is unread) may overtake the
        // alert.
        return Attempt{
            Attempt::kTlsFailed,
            {},
            "TLS: the member closed the connection after the handshake" + client_certificate_hint()};
      }
      if (call.watch && header_read && closed) return Attempt{Attempt::kWatchEnded, {}, "closed"};
      return failed(closed ? "closed the connection" : error_text(ec));
    }
    Attempt answer{Attempt::kAnswer, parser.release(), {}};
    if (!answer.reply.keep_alive()) drop_connection();
    return answer;
  }

  // One attempt of `call` on member `i`, over the kept connection when it goes there.
  Attempt attempt(std::size_t i, const Call& call) {
    const Endpoint& member = options.endpoints[i];
    http::request<http::string_body> request{call.method, call.target, kHttp11};
    request.set(http::field::host, member.to_string());
    request.set(http::field::user_agent, "ddprun");
    request.set(http::field::accept, "application/json");
    request.keep_alive(true);
    if (call.method == http::verb::put) {
      request.set(http::field::content_type, "application/x-www-form-urlencoded");
      request.body() = call.body;
    }
    request.prepare_payload();

    for (int tries = 0;; ++tries) {
      const auto now = Clock::now();
      auto header_deadline = now + options.request_timeout;
      if (call.watch) header_deadline = std::min(header_deadline, call.watch_deadline);
      const auto body_deadline = call.watch ? call.watch_deadline : header_deadline;
      if (connection && connection->member != i) drop_connection();
      if (!connection) {
        if (auto failure = connect(i, header_deadline)) {
          if (call.watch && failure->kind == Attempt::kMemberFailed && Clock::now() >= call.watch_deadline) {
            return Attempt{Attempt::kWatchTimedOut, {}, {}};
          }
          return *failure;
        }
      }
      Attempt result = connection->tls
                           ? exchange(*connection->tls, request, call, header_deadline, body_deadline)
                           : exchange(*connection->plain, request, call, header_deadline, body_deadline);
      // A kept connection the member had closed meanwhile: once more on a fresh one.
      if (result.stale && tries == 0) continue;
      return result;
    }
  }

  // Runs `call` on the members, in order from the one that answered last, until one answers (or, a watch, its
  // timeout passed: nullopt).
  // Runs `call` on the members, in order from the one that answered last, until one answers. A watch returns
  // nullopt once its timeout passed with etcd there to say that nothing changed; a member lost during a watch
  // (after one answered it) is retried, round the list, until the timeout.
  std::optional<Response> perform(const Call& call) {
    const std::size_t n = options.endpoints.size();
    std::vector<std::string> failures;  // "host:port: why", since a member last answered
    std::string unavailable;            // a watch: the last round in which no member answered
    bool tls_failed = false;
    bool answered = false;  // a member answered this call (a watch goes on after losing it)
    std::size_t member = current;
    const auto call_started = Clock::now();
    int extra_rounds = 0;  // rounds of the list after every member had failed once
    for (;;) {
      const auto started = Clock::now();
      Attempt result = attempt(member, call);
      const std::string name = member_text(member);
      std::optional<v2::Reply> reply;
      if (result.kind == Attempt::kAnswer) {
        reply = v2::Reply{result.reply.result_int(), result.reply.body(), std::nullopt};
        const auto index = result.reply.find("X-Etcd-Index");
        if (index != result.reply.end())
          reply->etcd_index = std::string_view(index->value().data(), index->value().size());
      }
      if (reply && call.watch && v2::is_empty_watch_reply(*reply)) {
        result.kind = Attempt::kWatchEnded;  // etcd ended the watch without an event: ask again
      }
      switch (result.kind) {
        case Attempt::kAnswer: {
          std::string failure;
          const v2::RequestText request{std::string(http::to_string(call.method)), call.target, call.key,
                                        name};
          auto response = v2::read_reply(*reply, request, failure);
          current = member;
          if (response) return response;
          failures.push_back(name + ": " + failure);
          break;
        }
        case Attempt::kTlsFailed:
          tls_failed = true;
          [[fallthrough]];
        case Attempt::kMemberFailed:
          failures.push_back(name + ": " + result.failure);
          break;
        case Attempt::kWatchTimedOut:
          if (failures.empty() && unavailable.empty()) return std::nullopt;
          break;  // the timeout passed while members were lost: unavailable (below)
        case Attempt::kWatchEnded:
          // The watch goes on: at the same member after an empty reply, at the next one (the same one when
          // alone) after a lost connection. Not more than ten times a second.
          current = member;
          answered = true;
          failures.clear();
          unavailable.clear();
          if (!result.failure.empty()) member = (member + 1) % n;
          std::this_thread::sleep_until(std::min(started + kWatchRetryPause, call.watch_deadline));
          if (Clock::now() >= call.watch_deadline) return std::nullopt;
          continue;
      }
      if (failures.size() >= n) {
        std::string text;
        for (const auto& f : failures) text += (text.empty() ? "" : "; ") + f;
        if (tls_failed) throw EtcdTlsError("no etcd member answered over TLS: " + text);
        if (!call.watch) {
          // Every member failed once: a leader election, or members restarting. Round the list again while the
          // request timeout lasts (an election takes about a second); then give up.
          if (Clock::now() + kRetryPause < call_started + options.request_timeout) {
            ++extra_rounds;
            failures.clear();
            std::this_thread::sleep_for(kRetryPause);
            member = (member + 1) % n;
            continue;
          }
          throw EtcdUnavailableError(
              (extra_rounds == 0 ? "no etcd member answered: "
                                 : "no etcd member answered within " + duration_text(options.request_timeout) + ": ") +
              text);
        }
        if (!answered || Clock::now() >= call.watch_deadline) {
          throw EtcdUnavailableError("no etcd member answered: " + text);
        }
        // A watch whose members were all lost: round the list again, until the timeout.
        unavailable = text;
        failures.clear();
        std::this_thread::sleep_until(std::min(started + kWatchRetryPause, call.watch_deadline));
      }
      if (call.watch && Clock::now() >= call.watch_deadline) {
        if (!failures.empty() || !unavailable.empty()) {
          if (!failures.empty()) {
            for (const auto& f : failures) unavailable += (unavailable.empty() ? "" : "; ") + f;
          }
          throw EtcdUnavailableError("no etcd member answered within the watch's " +
                                     duration_text(call.watch_timeout) + ": " + unavailable);
        }
        return std::nullopt;
      }
      member = (member + 1) % n;
    }
  }

  ClientOptions options;
  asio::io_context ioc;
  std::optional<ssl::context> ssl_context;
  std::unique_ptr<Connection> connection;
  std::size_t current = 0;  // the member that answered last
};

Client::Client(ClientOptions options) : options_(std::move(options)) {
  if (options_.endpoints.empty()) throw std::invalid_argument("etcd client: no endpoints given");
  impl_ = std::make_unique<Impl>(options_);
}

Client::~Client() {
  if (impl_) impl_->drop_connection();
}

std::string Client::current_endpoint() const {
  return impl_->member_text(impl_->current);
}

std::string Client::endpoints_text() const {
  std::string text;
  for (const auto& e : options_.endpoints) text += (text.empty() ? "" : ",") + e.to_string();
  return text;
}

Response Client::get(const std::string& key, const GetOptions& options) {
  Call call;
  call.key = v2::normalized_key(key);
  v2::Form query;
  if (options.recursive) query.add_flag("recursive", true);
  if (options.quorum) query.add_flag("quorum", true);
  call.target = v2::keys_path(call.key);
  if (!query.text().empty()) call.target += "?" + query.text();
  return *impl_->perform(call);
}

Response Client::write(const std::string& key, const std::string& value, const WriteOptions& options) {
  Call call;
  call.method = http::verb::put;
  call.key = v2::normalized_key(key);
  call.target = v2::keys_path(call.key);
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
  call.body = form.text();
  return *impl_->perform(call);
}

Response Client::remove(const std::string& key, const DeleteOptions& options) {
  Call call;
  call.method = http::verb::delete_;
  call.key = v2::normalized_key(key);
  v2::Form query;
  if (options.prev_value) query.add("prevValue", *options.prev_value);
  if (options.prev_index) query.add("prevIndex", std::to_string(*options.prev_index));
  if (options.dir) query.add_flag("dir", true);
  if (options.recursive) query.add_flag("recursive", true);
  call.target = v2::keys_path(call.key);
  if (!query.text().empty()) call.target += "?" + query.text();
  return *impl_->perform(call);
}

std::optional<Response> Client::watch(const std::string& key, uint64_t wait_index, bool recursive,
                                      std::chrono::milliseconds timeout) {
  Call call;
  call.watch = true;
  call.watch_deadline = Clock::now() + timeout;
  call.watch_timeout = timeout;
  call.key = v2::normalized_key(key);
  v2::Form query;
  query.add_flag("wait", true);
  if (wait_index > 0) query.add("waitIndex", std::to_string(wait_index));
  if (recursive) query.add_flag("recursive", true);
  call.target = v2::keys_path(call.key);
  call.target += "?" + query.text();
  return impl_->perform(call);
}

}  // namespace ddprun::rdzv::etcd
