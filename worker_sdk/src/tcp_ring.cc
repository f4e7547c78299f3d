#include "tcp_ring.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "reduce_kernels.h"

namespace ddprun::sdk {
namespace {

// Block b of n over `count` elements: the first count % n blocks have one element more.
void block_of(size_t count, int n, int b, size_t& off, size_t& len) {
  const size_t base = count / n, rem = count % n, ub = static_cast<size_t>(b);
  off = ub * base + std::min(ub, rem);
  len = base + (ub < rem ? 1 : 0);
}

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

}  // namespace

TcpRing::TcpRing(TcpListener& listener, std::vector<Member> members, int me, uint64_t tag,
                 size_t segment_bytes, AbortSignal& abort, const Deadline& deadline)
    : members_(std::move(members)),
      me_(me),
      segment_bytes_(std::max<size_t>(64, segment_bytes / 64 * 64)),
      abort_(abort),
      staging_(segment_bytes_) {
  const int n = size();
  if (n < 2) return;
  const Member& next = members_[mod(me_ + 1, n)];
  // The connection completes in the peer's backlog and the hello fits in the socket buffer, so connecting
  // before accepting cannot deadlock around the ring.
  next_ = connect_peer(next.host, next.port, next.rank, tag, members_[me_].rank, abort_, deadline);
  prev_ = listener.accept_peer(tag, prev_rank(), abort_, deadline);
}

int TcpRing::next_rank() const {
  return members_[mod(me_ + 1, size())].rank;
}
int TcpRing::prev_rank() const {
  return members_[mod(me_ - 1, size())].rank;
}

void TcpRing::shutdown() {
  if (next_) ::shutdown(next_.get(), SHUT_RDWR);
  if (prev_) ::shutdown(prev_.get(), SHUT_RDWR);
}

void TcpRing::fail_io(bool sending, int err) {
  const int peer = sending ? next_rank() : prev_rank();
  abort_.throw_if_raised();
  const std::string side = std::string(" (TCP ring, ") + (sending ? "sending to" : "receiving from") + " it)";
  if (err == 0) throw CollectiveError("rank " + std::to_string(peer) + " closed the connection" + side, peer);
  throw CollectiveError(
      "the connection with rank " + std::to_string(peer) + " failed: " + std::strerror(err) + side, peer);
}

void TcpRing::run(std::byte* buf, const std::vector<Step>& steps, DType dtype, ReduceOp op,
                  const Deadline& deadline) {
  const size_t nsteps = steps.size();
  const size_t es = dtype_size(dtype);
  const size_t seg = std::max(es, segment_bytes_ / es * es);
  std::vector<size_t> processed(nsteps, 0);  // received and reduced/copied bytes of each step
  size_t s_step = 0, s_done = 0;             // send cursor
  size_t r_step = 0, r_got = 0;              // receive cursor (r_got >= processed[r_step]: staged bytes)

  for (;;) {
    while (s_step < nsteps && s_done == steps[s_step].send_len) {
      ++s_step;
      s_done = 0;
    }
    while (r_step < nsteps && processed[r_step] == steps[r_step].recv_len) {
      ++r_step;
      r_got = 0;
    }
    if (s_step == nsteps && r_step == nsteps) return;
    abort_.throw_if_raised();

    bool progress = false, want_send = false, want_recv = false, gated = false;
    size_t recv_need = 0;  // bytes that make the receive side progress (a segment, or the step's rest)
    if (s_step < nsteps) {
      const Step& st = steps[s_step];
      size_t limit = st.gate < 0 ? st.send_len : std::min(st.send_len, processed[st.gate]);
      if (s_done < limit) {
        ssize_t k =
            ::send(next_.get(), buf + st.send_off + s_done, limit - s_done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
          s_done += static_cast<size_t>(k);
          progress = true;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
          want_send = true;
        } else {
          fail_io(true, k == 0 ? 0 : errno);
        }
      } else {
        gated = true;
      }
    }
    if (r_step < nsteps) {
      const Step& st = steps[r_step];
      std::byte* dst;
      size_t want;
      if (st.reduce) {
        const size_t this_seg = std::min(seg, st.recv_len - processed[r_step]);
        dst = staging_.data() + (r_got - processed[r_step]);
        want = this_seg - (r_got - processed[r_step]);
      } else {
        dst = buf + st.recv_off + r_got;
        want = st.recv_len - r_got;
      }
      ssize_t k = ::recv(prev_.get(), dst, want, MSG_DONTWAIT);
      if (k > 0) {
        r_got += static_cast<size_t>(k);
        progress = true;
        if (!st.reduce) {
          processed[r_step] = r_got;
        } else if (r_got - processed[r_step] == std::min(seg, st.recv_len - processed[r_step])) {
          const size_t len = r_got - processed[r_step];
          reduce_into(buf + st.recv_off + processed[r_step], staging_.data(), len / es, dtype, op,
                      st.divisor);
          processed[r_step] = r_got;
        }
      } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        want_recv = true;
        recv_need = st.reduce ? want : std::min(want, seg);
      } else {
        fail_io(false, k == 0 ? 0 : errno);
      }
    }
    if (progress) continue;

    pollfd p[3];
    nfds_t np = 0;
    if (want_send) p[np++] = {next_.get(), POLLOUT, 0};
    if (want_recv) {
      // Wake up once a useful amount has arrived, not for every packet (EOF and errors still wake us).
      const int lowat = static_cast<int>(std::max<size_t>(1, recv_need));
      if (lowat != rcvlowat_) {
        ::setsockopt(prev_.get(), SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof lowat);
        rcvlowat_ = lowat;
      }
      p[np++] = {prev_.get(), POLLIN, 0};
    }
    p[np++] = {abort_.fd(), POLLIN, 0};
    int rc = ::poll(p, np, deadline.remaining_ms());
    if (rc < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
    if (rc == 0 && deadline.expired()) {
      // Waiting to receive (or for received data that gates the send): the previous member is late.
      const bool blame_prev = want_recv || gated || !want_send;
      const int peer = blame_prev ? prev_rank() : next_rank();
      throw CollectiveError("timed out waiting for rank " + std::to_string(peer) + " (TCP ring, " +
                                (blame_prev ? "receiving from" : "sending to") + " it)",
                            peer);
    }
  }
}

void TcpRing::all_reduce(void* data, size_t count, DType dtype, ReduceOp op, int divisor,
                         const Deadline& deadline) {
  const int n = size();
  if (count == 0) return;
  if (n == 1) {
    divide_by(data, count, dtype, divisor);
    return;
  }
  const size_t es = dtype_size(dtype);
  std::vector<Step> steps;
  steps.reserve(2 * (n - 1));
  auto block = [&](int b, size_t& off, size_t& len) {
    block_of(count, n, mod(b, n), off, len);
    off *= es;
    len *= es;
  };
  for (int g = 0; g < n - 1; ++g) {  // reduce-scatter: afterwards member i owns block i+1
    Step st;
    block(me_ - g, st.send_off, st.send_len);
    block(me_ - g - 1, st.recv_off, st.recv_len);
    st.reduce = true;
    st.divisor = g == n - 2 ? divisor : 1;
    st.gate = g == 0 ? -1 : g - 1;
    steps.push_back(st);
  }
  for (int g = 0; g < n - 1; ++g) {  // all-gather of the owned blocks
    Step st;
    block(me_ + 1 - g, st.send_off, st.send_len);
    block(me_ - g, st.recv_off, st.recv_len);
    st.gate = static_cast<int>(steps.size()) - 1;
    steps.push_back(st);
  }
  run(static_cast<std::byte*>(data), steps, dtype, op, deadline);
}

void TcpRing::all_gatherv(void* out, const std::vector<size_t>& offsets, const std::vector<size_t>& lens,
                          const Deadline& deadline) {
  const int n = size();
  if (n == 1) return;
  std::vector<Step> steps;
  for (int g = 0; g < n - 1; ++g) {
    Step st;
    const int sb = mod(me_ - g, n), rb = mod(me_ - g - 1, n);
    st.send_off = offsets[sb];
    st.send_len = lens[sb];
    st.recv_off = offsets[rb];
    st.recv_len = lens[rb];
    st.gate = g == 0 ? -1 : g - 1;
    steps.push_back(st);
  }
  run(static_cast<std::byte*>(out), steps, DType::kUInt8, ReduceOp::kSum, deadline);
}

void TcpRing::broadcast(void* data, size_t bytes, int root, const Deadline& deadline) {
  const int n = size();
  if (n == 1 || bytes == 0) return;
  const int pos = mod(me_ - root, n);  // distance from the root along the ring
  Step st;
  if (pos > 0) st.recv_len = bytes;
  if (pos < n - 1) st.send_len = bytes;
  if (pos > 0 && pos < n - 1) st.gate = 0;  // forward what has arrived
  run(static_cast<std::byte*>(data), {st}, DType::kUInt8, ReduceOp::kSum, deadline);
}

void TcpRing::barrier(const Deadline& deadline) {
  std::vector<uint8_t> token(size(), 0);  // one element per block: nobody finishes before all have sent
  all_reduce(token.data(), token.size(), DType::kUInt8, ReduceOp::kMax, 1, deadline);
}

}  // namespace ddprun::sdk
