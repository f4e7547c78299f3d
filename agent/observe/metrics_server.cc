#include "agent/observe/metrics_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <system_error>
#include <thread>

namespace ddprun::agent {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr std::chrono::seconds kIdle{10};
constexpr std::chrono::milliseconds kAcceptRetry{100};  // after a failed accept (out of descriptors)

struct Handlers {
  std::function<std::string()> metrics;
  std::function<bool()> ready;
};

http::response<http::string_body> answer(const http::request<http::string_body>& req, const Handlers& h) {
  http::response<http::string_body> res;
  res.version(req.version());
  res.keep_alive(req.keep_alive());
  res.set(http::field::server, "ddprun");
  auto reply = [&](http::status status, std::string body, const char* type = "text/plain; charset=utf-8") {
    res.result(status);
    res.set(http::field::content_type, type);
    res.body() = std::move(body);
    res.prepare_payload();
    return res;
  };
  if (req.method() != http::verb::get && req.method() != http::verb::head) {
    return reply(http::status::method_not_allowed, "GET only\n");
  }
  const std::string_view target(req.target().data(), req.target().size());
  const std::string_view path = target.substr(0, target.find('?'));
  if (path == "/metrics")
    return reply(http::status::ok, h.metrics(), "text/plain; version=0.0.4; charset=utf-8");
  if (path == "/healthz") return reply(http::status::ok, "ok\n");
  if (path == "/readyz") {
    return h.ready() ? reply(http::status::ok, "ready\n")
                     : reply(http::status::service_unavailable, "not ready: no round runs its workers\n");
  }
  return reply(http::status::not_found, "try /metrics, /healthz or /readyz\n");
}

// One connection: read a request, answer, again while keep-alive.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const Handlers& h) : stream_(std::move(socket)), h_(h) {}
  void start() { read(); }

 private:
  void read() {
    req_ = {};
    stream_.expires_after(kIdle);
    http::async_read(stream_, buffer_, req_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->close();
      self->res_ = answer(self->req_, self->h_);
      http::async_write(self->stream_, self->res_, [self](beast::error_code wec, size_t) {
        if (wec || !self->res_.keep_alive()) return self->close();
        self->read();
      });
    });
  }
  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  }

  beast::tcp_stream stream_;
  const Handlers& h_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> req_;
  http::response<http::string_body> res_;
};

}  // namespace

struct MetricsServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer retry{io};
  Handlers handlers;
  std::thread thread;

  void accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) {
        std::make_shared<Session>(std::move(socket), handlers)->start();
        return accept();
      }
      // Out of descriptors (EMFILE, ENFILE) or memory: the pending connection stays in the backlog and the
      // next accept would fail at once, so retrying at once spins a core. Back off; the probes wait a little.
      retry.expires_after(kAcceptRetry);
      retry.async_wait([this](beast::error_code tec) {
        if (!tec) accept();
      });
    });
  }
};

MetricsServer::MetricsServer(const std::string& addr, uint16_t port, std::function<std::string()> metrics,
                             std::function<bool()> ready)
    : impl_(std::make_unique<Impl>()) {
  impl_->handlers = {std::move(metrics), std::move(ready)};
  const std::string where = (addr.empty() ? "*" : addr) + ":" + std::to_string(port);
  try {
    const auto ip =
        addr.empty() ? asio::ip::address(asio::ip::address_v6::any()) : asio::ip::make_address(addr);
    const tcp::endpoint ep(ip, port);
    impl_->acceptor.open(ep.protocol());
    if (ip.is_v6() && addr.empty()) impl_->acceptor.set_option(asio::ip::v6_only(false));
    impl_->acceptor.set_option(asio::socket_base::reuse_address(true));
    impl_->acceptor.bind(ep);
    impl_->acceptor.listen();
  } catch (const boost::system::system_error& e) {
    throw std::system_error(e.code().value(), std::generic_category(),
                            "cannot serve metrics on " + where + ": " + e.code().message());
  }
  impl_->accept();
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

MetricsServer::~MetricsServer() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint16_t MetricsServer::port() const {
  return impl_->acceptor.local_endpoint().port();
}

}  // namespace ddprun::agent
