// StoreServer::Connection (store_server_impl.h): one client's socket, its session, and the writes of what the
// session owes it.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

#include "rendezvous/store/store_server_impl.h"

namespace ddprun::rdzv {

StoreServer::Connection::Connection(std::shared_ptr<Impl> server, tcp::socket socket, std::string peer,
                                    std::string address, bool stranger)
    : server_(std::move(server)),
      socket_(std::move(socket)),
      peer_(std::move(peer)),
      address_(std::move(address)),
      stranger_counted_(stranger),
      timer_(server_->io),
      handshake_timer_(server_->io),
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
  if (stranger_counted_) ++server_->handshaking[source_of(address_)];
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
  boost::system::error_code ignored;
  socket_.set_option(tcp::no_delay(true), ignored);
  socket_.non_blocking(true, ignored);
  if (stranger_counted_) {
    handshake_timer_.expires_after(server_->options.handshake_timeout);
    handshake_timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (ec || self->closed_ || self->established_ || self->server_->admitted(self->address_)) return;
      self->drop_handshake("did not authenticate within " +
                           std::to_string(self->server_->options.handshake_timeout.count()) + " ms");
    });
  }
  wait_readable();
}

void StoreServer::Connection::drop_handshake(const std::string& why) {
  ++server_->counters.handshakes_dropped;
  server_->note_refusal(address_, peer_, why);
  close("");
}

void StoreServer::Connection::note_established() {
  if (established_ || !session_.established()) return;
  established_ = true;
  handshake_timer_.cancel();
  if (std::exchange(stranger_counted_, false)) {
    auto it = server_->handshaking.find(source_of(address_));
    if (it != server_->handshaking.end() && --it->second == 0) server_->handshaking.erase(it);
  }
}

void StoreServer::Connection::close(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  if (agent_counted_ && --server_->agent_addresses[address_] <= 0) server_->agent_addresses.erase(address_);
  agent_counted_ = false;
  if (std::exchange(stranger_counted_, false)) {
    auto it = server_->handshaking.find(source_of(address_));
    if (it != server_->handshaking.end() && --it->second == 0) server_->handshaking.erase(it);
  }
  handshake_timer_.cancel();
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
  if (reading_ || closed_ || auth_running_) return;
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
  if (spoke_at_ == std::chrono::steady_clock::time_point{}) {
    spoke_at_ = std::chrono::steady_clock::now();
    server_->handshake_only.push_back(shared_from_this());  // dropped from it once established
  }
  std::span<const uint8_t> input(scratch.data(), n);
  if (!pending_.empty()) {
    pending_.insert(pending_.end(), input.begin(), input.end());
    input = pending_;
  }
  process(input);
}

void StoreServer::Connection::process(std::span<const uint8_t> input) {
  size_t max_output = server_->options.max_output_bytes;
  server_->handling = this;
  auto result = session_.consume(input, max_output - std::min(max_output, writing_.size()));
  server_->handling = nullptr;
  server_->counters.requests += result.requests;
  for (size_t op = 0; op < kOpCount; ++op) server_->counters.requests_by_op[op] += result.by_op[op];
  if (!settle(result)) return;
  if (result.auth_pending) {
    keep_rest(input, result.consumed);  // no deadline: nothing is read until the step is done
    if (timer_armed_) {
      timer_armed_ = false;
      timer_.cancel();
    }
    run_auth_step();
    if (closed_) return;
    flush();
    if (!closed_) account();
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

bool StoreServer::Connection::settle(const StoreSession::ConsumeResult& result) {
  if (result.refused) {
    ++server_->counters.unauthorized;
    server_->note_refusal(address_, peer_, result.error);
    close("");
    return false;
  }
  if (!result.error.empty()) {
    flush();  // what it was owed before the broken request
    close(result.error);
    return false;
  }
  note_established();
  return true;
}

void StoreServer::Connection::run_auth_step() {
  auth_running_ = true;
  std::weak_ptr<Connection> weak = shared_from_this();
  asio::io_context& io = server_->io;
  const bool queued = server_->auth_workers.submit([step = session_.take_auth_step(), weak, &io] {
    StoreSession::AuthOutcome outcome = step.run();
    asio::post(io, [weak, outcome = std::move(outcome)]() mutable {
      if (auto self = weak.lock()) self->auth_done(std::move(outcome));
    });
  });
  if (!queued) {
    drop_handshake("the store's queue of authentications is full (" +
                   std::to_string(server_->auth_workers.max_queued()) +
                   " waiting for munged): try again when the store is less busy");
  }
}

void StoreServer::Connection::auth_done(StoreSession::AuthOutcome outcome) {
  auth_running_ = false;
  if (closed_) return;
  if (!settle(session_.finish_auth(std::move(outcome)))) return;
  if (!pending_.empty()) {
    process(pending_);  // what the client sent after its AUTH request
    return;
  }
  flush();
  if (closed_) return;
  account();
  if (!closed_) wait_readable();
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
  keep_rest(input, consumed);
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

void StoreServer::Connection::keep_rest(std::span<const uint8_t> input, size_t consumed) {
  if (input.data() == pending_.data()) {
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(consumed));
  } else {
    pending_.assign(input.begin() + static_cast<ptrdiff_t>(consumed), input.end());
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
