#include "agent/state/state_connection.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "agent/state/crc32c.h"
#include "rendezvous/util/state_format.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::agent {

namespace {

constexpr size_t kChunk = size_t{1} << 20;

// The job's auth where its store requires the proof, as the store does; else none (MUNGE under --rdzv_auth
// auto on a node whose munged failed its check: the job's agents meet as at an open store).
const rdzv::StoreAuth* required(const rdzv::StoreAuth* auth) {
  return auth && auth->store_requires() ? auth : nullptr;
}

// A read-only shared mapping of the first `n` bytes of `fd` (nothing for n == 0).
class Mapping {
 public:
  Mapping(int fd, uint64_t n) : n_(n) {
    if (n == 0) return;
    data_ = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0);
    if (data_ == MAP_FAILED) data_ = nullptr;
  }
  ~Mapping() {
    if (data_) ::munmap(data_, n_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  bool ok() const { return n_ == 0 || data_ != nullptr; }
  unsigned char* data() const { return static_cast<unsigned char*>(data_); }

 private:
  void* data_ = nullptr;
  uint64_t n_;
};

std::string error_text(int err) {
  return std::strerror(err);
}

}  // namespace

StateConnection StateConnection::connect(const std::string& host, uint16_t port,
                                         std::chrono::milliseconds timeout, std::chrono::milliseconds idle) {
  const std::string peer = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    throw StateTransferError("cannot resolve " + peer + ": " + ::gai_strerror(rc));
  }
  std::string last = "no address";
  const auto deadline = Clock::now() + timeout;
  for (addrinfo* a = found; a; a = a->ai_next) {
    UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) continue;
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last = error_text(errno);
      continue;
    }
    pollfd p{fd.get(), POLLOUT, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0))) <= 0) {
      last = "no answer within " + std::to_string(timeout.count()) + " ms";
      continue;
    }
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      last = error_text(err);
      continue;
    }
    ::freeaddrinfo(found);
    const int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return StateConnection(std::move(fd), peer, idle);
  }
  ::freeaddrinfo(found);
  throw StateTransferError("cannot connect to the agent at " + peer + ": " + last);
}

StateConnection::StateConnection(UniqueFd fd, std::string peer, std::chrono::milliseconds idle)
    : fd_(std::move(fd)), peer_(std::move(peer)), idle_(idle) {
  const int flags = ::fcntl(fd_.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd_.get(), F_SETFL, flags | O_NONBLOCK);
}

void StateConnection::fail(const std::string& what) const {
  throw StateTransferError("the agent at " + peer_ + ": " + what);
}

void StateConnection::wait_for(short events) {
  pollfd p{fd_.get(), events, 0};
  while (true) {
    const int rc = ::poll(&p, 1, static_cast<int>(idle_.count()));
    if (rc > 0) return;
    if (rc == 0) fail("nothing moved for " + std::to_string(idle_.count() / 1000) + " s");
    if (errno != EINTR) fail(std::string("poll: ") + error_text(errno));
  }
}

void StateConnection::write_all(const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t sent = ::send(fd_.get(), p, n, MSG_NOSIGNAL);
    if (sent > 0) {
      p += sent;
      n -= static_cast<size_t>(sent);
    } else if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      wait_for(POLLOUT);
    } else if (sent < 0 && errno != EINTR) {
      fail("lost the connection: " + error_text(errno));
    }
  }
}

void StateConnection::read_all(void* data, size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = ::recv(fd_.get(), p, n, 0);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
    } else if (got == 0) {
      fail("the connection was closed");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_for(POLLIN);
    } else if (errno != EINTR) {
      fail("lost the connection: " + error_text(errno));
    }
  }
}

void StateConnection::send_frame(std::string_view body) {
  const std::string header = frame_header(static_cast<uint32_t>(body.size()));
  write_all(header.data(), header.size());
  write_all(body.data(), body.size());
}

std::string StateConnection::receive_frame() {
  unsigned char header[4];
  read_all(header, sizeof header);
  const uint32_t n = frame_length(header);
  if (n > kMaxStateFrame) fail("a frame of " + std::to_string(n) + " bytes (not ddprun's protocol?)");
  std::string body(n, '\0');
  read_all(body.data(), n);
  return body;
}

void StateConnection::send(const StateMessage& m) {
  send_frame(encode_message(m));
}

StateMessage StateConnection::receive() {
  std::string why;
  auto m = decode_message(receive_frame(), why);
  if (!m) fail(why);
  return *m;
}

void StateConnection::client_handshake(const rdzv::StoreAuth* auth) {
  auth = required(auth);
  write_all(kStateMagic.data(), kStateMagic.size());
  const std::string nonce = auth ? auth->nonce() : "";
  send_frame(nonce);
  const std::string server_nonce = receive_frame();
  const std::string server_proof = receive_frame();
  if (auth) {
    std::string why;
    if (server_nonce.empty()) fail("it keeps an open job's state, but this agent proves the job's secret");
    if (!auth->verify(kStateServerRole, nonce, server_nonce, server_proof, why))
      fail("not this job's agent: " + why);
    send_frame(auth->proof(kStateClientRole, nonce, server_nonce));
  } else {
    if (!server_nonce.empty())
      fail("it asks for the job's secret (--rdzv_secret_file), which this agent lacks");
    send_frame("");
  }
  const StateMessage answer = receive();
  if (answer.kind == StateMessage::Kind::kError) fail("refused this agent: " + answer.text);
  if (answer.kind != StateMessage::Kind::kOk) fail("an unexpected answer to the opening");
}

bool StateConnection::server_handshake(const rdzv::StoreAuth* auth, std::string& why) {
  auth = required(auth);
  char magic[8];
  read_all(magic, sizeof magic);
  if (std::string_view(magic, sizeof magic) != kStateMagic) {
    why = "not ddprun's state protocol (first bytes '" + printable(std::string_view(magic, sizeof magic)) +
          "')";
    return false;
  }
  const std::string client_nonce = receive_frame();
  const std::string nonce = auth ? auth->nonce() : "";
  send_frame(nonce);
  send_frame(auth && !client_nonce.empty() ? auth->proof(kStateServerRole, client_nonce, nonce) : "");
  const std::string proof = receive_frame();
  if (auth && (client_nonce.empty() || !auth->verify(kStateClientRole, client_nonce, nonce, proof, why))) {
    if (client_nonce.empty()) why = "it does not prove the job's secret";
    send(StateMessage{.kind = StateMessage::Kind::kError, .text = "this agent admits only the job's agents"});
    return false;
  }
  send(StateMessage{.kind = StateMessage::Kind::kOk});
  return true;
}

void StateConnection::send_file(int fd, uint64_t n, const Pace& pace) {
  Mapping map(fd, n);
  if (!map.ok()) fail("cannot map the version to send: " + error_text(errno));
  uint32_t crc = 0;
  for (uint64_t done = 0; done < n;) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(kChunk, n - done));
    if (pace && !pace(chunk)) fail("the copy was given up (the agent stops)");
    crc = crc32c(crc, map.data() + done, chunk);
    write_all(map.data() + done, chunk);
    done += chunk;
  }
  send(StateMessage{.kind = StateMessage::Kind::kDone, .crc = crc});
}

void StateConnection::receive_file(int fd, uint64_t n) {
  // The room first (a full tmpfs says so here, not halfway), then chunks through a buffer and pwrite(2),
  // which fails cleanly where a write into a mapping would raise SIGBUS.
  if (n > 0) {
    const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(n));
    if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) fail("no room for the version: " + error_text(rc));
  }
  std::string buffer(static_cast<size_t>(std::min<uint64_t>(kChunk, n)), '\0');
  uint32_t crc = 0;
  for (uint64_t done = 0; done < n;) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(kChunk, n - done));
    read_all(buffer.data(), chunk);
    crc = crc32c(crc, buffer.data(), chunk);
    for (size_t written = 0; written < chunk;) {
      const ssize_t w =
          ::pwrite(fd, buffer.data() + written, chunk - written, static_cast<off_t>(done + written));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("cannot write the version: " + error_text(errno));
      written += static_cast<size_t>(w);
    }
    done += chunk;
  }
  const StateMessage end = receive();
  if (end.kind != StateMessage::Kind::kDone) fail("a version not followed by its CRC");
  if (end.crc != crc) {
    fail("the copy's CRC-32C " + std::to_string(crc) + " differs from the sender's " +
         std::to_string(end.crc));
  }
}

std::string StateConnection::receive_version(int rank, int64_t step, uint64_t n,
                                             const std::filesystem::path& tmp,
                                             const std::filesystem::path& dest) {
  UniqueFd fd(::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd) return "cannot create " + tmp.string() + ": " + error_text(errno);
  std::error_code ignored;
  try {
    receive_file(fd.get(), n);
  } catch (const StateTransferError&) {
    std::filesystem::remove(tmp, ignored);
    throw;
  }
  std::string why;
  const auto manifest = read_manifest(fd.get(), n, why);
  if (manifest && (manifest->rank != rank || manifest->step != step)) {
    why = "it holds rank " + std::to_string(manifest->rank) + "'s step " + std::to_string(manifest->step);
  }
  if (!manifest || !why.empty()) {
    std::filesystem::remove(tmp, ignored);
    return "not a version of rank " + std::to_string(rank) + "'s step " + std::to_string(step) + ": " + why;
  }
  std::error_code renamed;
  std::filesystem::rename(tmp, dest, renamed);
  if (renamed) {
    std::filesystem::remove(tmp, ignored);
    return "cannot commit " + dest.string() + ": " + renamed.message();
  }
  return "";
}

void StateConnection::interrupt() {
  if (fd_) ::shutdown(fd_.get(), SHUT_RDWR);
}

}  // namespace ddprun::agent
