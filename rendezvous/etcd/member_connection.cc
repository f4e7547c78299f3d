#include "rendezvous/etcd/member_connection.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
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
#include <utility>

#include "rendezvous/util/duration_text.h"

namespace ddprun::rdzv::etcd {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using Clock = MemberConnection::Clock;
using Outcome = MemberConnection::Outcome;
using boost::system::error_code;

constexpr unsigned kHttp11 = 11;
constexpr std::size_t kMaxReplyBytes = 256u << 20;  // a recursive listing of a large tree

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

Outcome failed(std::string why) {
  return Outcome{.kind = Outcome::kFailed, .failure = std::move(why)};
}

Outcome tls_failed(std::string why) {
  return Outcome{.kind = Outcome::kTlsFailed, .failure = std::move(why)};
}

ssl::context make_ssl_context(const TlsFiles& files) {
  ssl::context ctx(ssl::context::tls_client);
  ctx.set_verify_mode(ssl::verify_peer);
  auto load = [&](const std::string& path, const char* what, auto&& loader) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
      throw EtcdTlsError(std::string("etcd TLS: cannot read the ") + what + " '" + path +
                         "': " + std::strerror(errno));
    }
    std::fclose(f);
    error_code ec;
    loader(ec);
    if (ec) {
      throw EtcdTlsError(std::string("etcd TLS: the ") + what + " '" + path +
                         "' is not usable: " + ec.message());
    }
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

}  // namespace

struct MemberConnection::State {
  // The kept connection, to endpoints[member].
  struct Stream {
    std::size_t member = 0;
    std::unique_ptr<beast::tcp_stream> plain;
    std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> tls;
    beast::flat_buffer buffer;
    bool reused = false;  // carried a request already: a failure before any reply byte may be a stale one
    beast::tcp_stream& tcp() { return tls ? beast::get_lowest_layer(*tls) : *plain; }
  };

  // One try: its outcome, and whether it failed on a kept connection that the member had closed meanwhile
  // (then worth one more try on a fresh connection).
  struct Try {
    Outcome outcome;
    bool stale = false;
  };

  explicit State(const ClientOptions& options) : options(options) {
    if (options.https) ssl_context.emplace(make_ssl_context(options.tls));
  }

  // Runs the io_context until every started operation completed (their deadlines bound that).
  void run() {
    ioc.restart();
    ioc.run();
  }

  void close() {
    if (!stream) return;
    error_code ignored;
    stream->tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream->tcp().close();
    run();  // completes whatever the close cancelled
    stream.reset();
  }

  // Why a member that asks for a client certificate may have refused this client.
  std::string client_certificate_hint() const {
    return options.tls.cert_file.empty()
               ? " (the member requires a client certificate: none was given)"
               : " (the member refused the client certificate '" + options.tls.cert_file + "')";
  }

  // Connects (and shakes hands) to member `i` by `deadline`; on failure returns the outcome that says why.
  std::optional<Outcome> connect(std::size_t i, Clock::time_point deadline) {
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

    auto conn = std::make_unique<Stream>();
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
        return tls_failed("TLS: cannot set the server name '" + member.host + "'");
      }
      conn->tls->set_verify_callback(ssl::host_name_verification(member.host));
      conn->tls->async_handshake(ssl::stream_base::client, [&](const error_code& e) { ec = e; });
      run();
      if (ec == beast::error::timeout) return failed("no TLS handshake within " + budget);
      if (ec && ec.category() == asio::error::get_ssl_category()) {
        return tls_failed("TLS handshake failed: " + tls_reason(ec, ssl));
      }
      if (ec) {  // closed during the handshake: most likely not an https port
        return tls_failed("TLS handshake failed: " + error_text(ec) + " (does the member serve https?)");
      }
    }
    stream = std::move(conn);
    return std::nullopt;
  }

  // Writes the request and reads the reply on the kept connection. The reply's header is due by
  // `header_deadline`, its body by `body_deadline`.
  template <class AsyncStream>
  Try send(AsyncStream& s, http::request<http::string_body>& request, Clock::time_point header_deadline,
           Clock::time_point body_deadline) {
    Stream& conn = *stream;
    const bool conn_tls = conn.tls != nullptr;
    const bool reused = conn.reused;
    conn.reused = true;
    error_code ec;
    conn.tcp().expires_at(header_deadline);
    http::async_write(s, request, [&](const error_code& e, std::size_t) { ec = e; });
    run();
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxReplyBytes);
    if (!ec) {
      http::async_read_header(s, conn.buffer, parser, [&](const error_code& e, std::size_t) { ec = e; });
      run();
    }
    if (!ec && !parser.is_done()) {
      conn.tcp().expires_at(body_deadline);
      http::async_read(s, conn.buffer, parser, [&](const error_code& e, std::size_t) { ec = e; });
      run();
    }
    if (ec) {
      const bool header_read = parser.is_header_done();
      close();
      if (ec == beast::error::timeout) {
        return {failed("no answer within " + duration_text(options.request_timeout))};
      }
      if (ec.category() == asio::error::get_ssl_category() && ec != ssl::error::stream_truncated) {
        std::string why = "TLS: " + error_text(ec);
        if (why.find("alert") != std::string::npos && why.find("certificate") != std::string::npos) {
          why += client_certificate_hint();
        }
        return {tls_failed(why)};
      }
      const bool closed = ec == http::error::end_of_stream || ec == asio::error::eof ||
                          ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
                          ec == ssl::error::stream_truncated || ec == http::error::partial_message;
      if (closed && reused && !header_read) return {failed("closed the connection"), true};
      if (closed && conn_tls && !header_read) {
        // TLS 1.3 checks the client's certificate after the client's handshake ended: a member that refuses
        // it sends an alert and closes, and the close (a reset, as the request is unread) may overtake the
        // alert.
        return {tls_failed("TLS: the member closed the connection after the handshake" +
                           client_certificate_hint())};
      }
      if (closed && header_read) {
        return {Outcome{.kind = Outcome::kCutShort, .failure = "closed the connection"}};
      }
      return {failed(closed ? "closed the connection" : error_text(ec))};
    }
    http::response<http::string_body> reply = parser.release();
    Outcome answer{.kind = Outcome::kReply, .status = reply.result_int(), .body = std::move(reply.body())};
    if (const auto index = reply.find("X-Etcd-Index"); index != reply.end()) {
      answer.etcd_index = std::string(index->value().data(), index->value().size());
    }
    if (!reply.keep_alive()) close();
    return {std::move(answer)};
  }

  ClientOptions options;
  asio::io_context ioc;
  std::optional<ssl::context> ssl_context;
  std::unique_ptr<Stream> stream;
};

MemberConnection::MemberConnection(const ClientOptions& options) : state_(std::make_unique<State>(options)) {}

MemberConnection::~MemberConnection() {
  state_->close();
}

void MemberConnection::close() {
  state_->close();
}

Outcome MemberConnection::exchange(std::size_t member, const Request& request,
                                   std::optional<Clock::time_point> long_poll_until) {
  State& st = *state_;
  http::request<http::string_body> message{http::string_to_verb(request.method), request.target, kHttp11};
  message.set(http::field::host, st.options.endpoints[member].to_string());
  message.set(http::field::user_agent, "ddprun");
  message.set(http::field::accept, "application/json");
  message.keep_alive(true);
  if (message.method() == http::verb::put) {
    message.set(http::field::content_type, "application/x-www-form-urlencoded");
    message.body() = request.body;
  }
  message.prepare_payload();

  for (int tries = 0;; ++tries) {
    auto header_deadline = Clock::now() + st.options.request_timeout;
    if (long_poll_until) header_deadline = std::min(header_deadline, *long_poll_until);
    const auto body_deadline = long_poll_until.value_or(header_deadline);
    if (st.stream && st.stream->member != member) st.close();
    if (!st.stream) {
      if (auto failure = st.connect(member, header_deadline)) return *failure;
    }
    State::Try result = st.stream->tls ? st.send(*st.stream->tls, message, header_deadline, body_deadline)
                                       : st.send(*st.stream->plain, message, header_deadline, body_deadline);
    // A kept connection the member had closed meanwhile: once more on a fresh one.
    if (result.stale && tries == 0) continue;
    return std::move(result.outcome);
  }
}

}  // namespace ddprun::rdzv::etcd
