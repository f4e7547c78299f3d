// StoreServer::Connection (store_server_impl.h): one client's socket, its session, and the writes of what the
// session owes it.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

#include "rendezvous/store/store_server_impl.h"

namespace ddprun::rdzv {

StoreServer::Connection::Connection(std::shared_ptr<Impl> server, tcp::socket socket, std::string peer,
                                    std::string address)
    : server_(std::move(server)),
      socket_(std::move(socket)),
      peer_(std::move(peer)),
      address_(std::move(address)),
      timer_(server_->io),
      session_(
          server_->state, server_->options.limits, server_->options.dialect, [this] { on_async_output(); },
          &server_->shared),
      writing_(&server_->shared) {
  if (server_->options.auth) {
    session_.set_admission({.auth = server_->options.auth,
                            .peer_admitted = [this] { return server_->admitted(address_); },
                            .on_authenticated =
                                [this] {
                                  ++server_->agent_addresses[address_];
                                  agent_counted_ = true;
                                }});
  }
}

void StoreServer::Connection::account() {
  recount();
  if (server_->buffered() > server_->options.memory_budget) server_->enforce_budget();
}

void StoreServer::Connection::recount() {
  const size_t now = closed_ ? 0 : pending_.size() + session_.output().owned_bytes() + writing_.owned_bytes();
  server_->owned = server_->owned - accounted_ + now;
  accounted_ = now;
  server_->peak_buffered = std::max(server_->peak_buffered, server_->buffered());
}

void StoreServer::Connection::close_soon(std::string reason) {
  if (closed_ || close_posted_) return;
  close_posted_ = true;
  session_.output().clear();
  recount();
  asio::post(server_->io, [self = shared_from_this(), reason = std::move(reason)] { self->close(reason); });
}

void StoreServer::Connection::start() {
  socket_.set_option(tcp::no_delay(true));
  socket_.non_blocking(true);
  wait_readable();
}

void StoreServer::Connection::close(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  if (agent_counted_ && --server_->agent_addresses[address_] <= 0) server_->agent_addresses.erase(address_);
  agent_counted_ = false;
  if (!reason.empty()) {
    ++server_->counters.dropped;
    spdlog::warn("store: dropping client {}: {}", peer_, reason);
  }
  boost::system::error_code ignored;
  timer_.cancel();
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  recount();  // closed: holds nothing any more
  server_->connections.erase(shared_from_this());
}

void StoreServer::Connection::wait_readable() {
  if (reading_ || closed_) return;
  reading_ = true;
  socket_.async_wait(tcp::socket::wait_read,
                     [self = shared_from_this()](const boost::system::error_code& ec) {
                       self->reading_ = false;
                       if (ec) {
                         if (ec != asio::error::operation_aborted) self->close("");
                         return;
                       }
                       self->on_readable();
                     });
}

void StoreServer::Connection::on_readable() {
  if (closed_) return;
  auto& scratch = server_->scratch;
  boost::system::error_code ec;
  size_t n = socket_.read_some(asio::buffer(scratch), ec);
  if (ec == asio::error::would_block || ec == asio::error::try_again) {
    wait_readable();
    return;
  }
  if (ec || n == 0) {
    close("");  // peer closed or reset: normal end of a client
    return;
  }
  silent_ = false;
  std::span<const uint8_t> input(scratch.data(), n);
  if (!pending_.empty()) {
    pending_.insert(pending_.end(), input.begin(), input.end());
    input = pending_;
  }
  size_t max_output = server_->options.max_output_bytes;
  server_->handling = this;
  auto result = session_.consume(input, max_output - std::min(max_output, writing_.size()));
  server_->handling = nullptr;
  server_->counters.requests += result.requests;
  for (size_t op = 0; op < kOpCount; ++op) server_->counters.requests_by_op[op] += result.by_op[op];
  if (result.refused) {
    server_->note_refusal(address_, peer_, result.error);
    close("");
    return;
  }
  if (!result.error.empty()) {
    flush();
    close(result.error);
    return;
  }
  keep_partial(input, result.consumed);
  if (closed_) return;
  flush();
  if (closed_) return;
  if (queued() > server_->options.max_output_bytes) {
    close("not reading its replies (" + std::to_string(queued()) + " bytes queued)");
    return;
  }
  account();
  if (closed_) return;
  if (!write_in_flight_ || session_.output().size() < kPauseReadingAt) wait_readable();
}

void StoreServer::Connection::keep_partial(std::span<const uint8_t> input, size_t consumed) {
  if (consumed == input.size()) {
    pending_.clear();
    pending_.shrink_to_fit();
    if (timer_armed_) {
      timer_armed_ = false;
      timer_.cancel();
    }
    return;
  }
  if (input.data() == pending_.data()) {
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(consumed));
  } else {
    pending_.assign(input.begin() + static_cast<ptrdiff_t>(consumed), input.end());
  }
  if (!timer_armed_) {
    timer_armed_ = true;
    timer_.expires_after(server_->options.request_timeout);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (ec || !self->timer_armed_) return;
      self->timer_armed_ = false;
      self->close("request not completed within " +
                  std::to_string(self->server_->options.request_timeout.count()) + " ms (" +
                  std::to_string(self->pending_.size()) + " bytes received)");
    });
  }
}

void StoreServer::Connection::on_async_output() {
  if (close_posted_) {
    session_.output().clear();  // being dropped: nothing more is kept for it
    return;
  }
  flush();
  if (closed_) return;
  if (queued() > server_->options.max_output_bytes) {
    close_soon("not reading its notifications (" + std::to_string(queued()) + " bytes queued)");
  }
  account();
}

void StoreServer::Connection::flush() {
  if (write_in_flight_ || closed_ || session_.output().empty()) return;
  write_in_flight_ = true;
  writing_.swap(session_.output());
  gather_.clear();
  writing_.for_each_piece([this](const char* p, size_t n) { gather_.emplace_back(p, n); });
  auto done = [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
    self->write_in_flight_ = false;
    self->writing_.clear();
    self->account();
    if (ec) {
      if (ec != asio::error::operation_aborted) self->close("");
      return;
    }
    self->flush();
    self->wait_readable();
  };
  if (gather_.size() == 1) {
    asio::async_write(socket_, gather_.front(), std::move(done));  // small replies: one piece
  } else {
    asio::async_write(socket_, std::span<const asio::const_buffer>(gather_), std::move(done));
  }
}

}  // namespace ddprun::rdzv
