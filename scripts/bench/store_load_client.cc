// ddprun-store-bench's connection: sends a request, reads one reply (store_load.h).
#include "scripts/bench/store_load.h"

namespace ddprun::bench::store_load {

// ---- Client ----------------------------------------------------------------------------------------------

void Client::issue(const std::string& request, ReplyKind kind) {
  kind_ = kind;
  have_ = 0;
  sent_at_ = Clock::now();
  boost::system::error_code ec;
  size_t n = socket_.write_some(asio::buffer(request), ec);  // non-blocking; one send() in practice
  if (ec == asio::error::would_block || ec == asio::error::try_again) {
    n = 0;
    ec = {};
  }
  if (ec) {
    bench_.on_failure(*this, "send: " + ec.message());
    return;
  }
  if (n < request.size()) {
    asio::async_write(socket_, asio::buffer(request.data() + n, request.size() - n),
                      [this](const boost::system::error_code& wec, size_t) {
                        if (!wec || wec == asio::error::operation_aborted) return;
                        write_error_ = "send: " + wec.message();
                        close();  // aborts the reply wait, which reports write_error_
                      });
  }
  wait_reply();
}

// A readiness wait, then a non-blocking read: no read() is made that could only return EAGAIN.
void Client::wait_reply() {
  socket_.async_wait(tcp::socket::wait_read,
                     [this](const boost::system::error_code& ec) { on_readable(ec); });
}

void Client::on_readable(const boost::system::error_code& ec) {
  if (ec) {
    bench_.on_failure(*this, ec != asio::error::operation_aborted ? "wait: " + ec.message() : write_error_);
    return;
  }
  if (in_.size() - have_ < 1024) in_.resize(in_.size() * 2);
  boost::system::error_code rec;
  size_t n = socket_.read_some(asio::buffer(in_.data() + have_, in_.size() - have_), rec);
  if (rec == asio::error::would_block || rec == asio::error::try_again) {
    wait_reply();
    return;
  }
  if (rec || n == 0) {
    bench_.on_failure(*this, rec ? "receive: " + rec.message() : "the server closed the connection");
    return;
  }
  have_ += n;
  rdzv::WireReader reader(std::span<const uint8_t>(in_.data(), have_));
  if (kind_ == ReplyKind::kInt) {
    if (!reader.i64(int_reply_)) {
      wait_reply();
      return;
    }
  } else {
    auto st = reader.bytes(bytes_reply_, size_t{1} << 30);
    if (st == rdzv::WireReader::BytesStatus::kShort) {
      wait_reply();
      return;
    }
    if (st == rdzv::WireReader::BytesStatus::kTooLong) {
      bench_.on_failure(*this, "a reply declares a value over 1 GiB");
      return;
    }
  }
  if (reader.remaining() != 0) {
    bench_.on_failure(*this, std::to_string(reader.remaining()) + " unexpected bytes after a reply");
    return;
  }
  bench_.on_reply(*this);
}

}  // namespace ddprun::bench::store_load
