// StoreServerThread (rendezvous/store_server.h): a StoreServer on an io_context and a thread of its own.
#include <boost/asio.hpp>
#include <future>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

#include "rendezvous/store/store_server.h"

namespace ddprun::rdzv {

namespace asio = boost::asio;

StoreServerThread::StoreServerThread(StoreServerOptions options) {
  server_ = std::make_unique<StoreServer>(io_, std::move(options));
  port_ = server_->port();
  endpoint_ = server_->local_endpoint();
  thread_ = std::thread([this] {
    auto guard = asio::make_work_guard(io_);
    io_.run();
  });
}

StoreServerThread::~StoreServerThread() {
  stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

void StoreServerThread::stop() {
  if (io_.stopped()) return;
  std::promise<void> done;
  auto fut = done.get_future();
  asio::post(io_, [&] {
    server_->stop();
    done.set_value();
  });
  fut.wait();
  io_.stop();
}

StoreServerStats StoreServerThread::stats() {
  if (io_.stopped()) return server_->stats();
  std::promise<StoreServerStats> p;
  auto fut = p.get_future();
  asio::post(io_, [&] { p.set_value(server_->stats()); });
  return fut.get();
}

}  // namespace ddprun::rdzv
