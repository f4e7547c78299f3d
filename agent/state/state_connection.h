// StateConnection: one TCP connection of the protocol of agent/state/state_wire.h between two agents,
// blocking, every wait bounded: a peer that sends or takes nothing for `idle` fails the exchange. A version
// file is sent straight from the page cache (mapped) and received through a buffer (pwrite: a full tmpfs is
// an error, not a SIGBUS), its CRC-32C computed on the way at both ends (agent/state/crc32c.h) and compared
// at the end.
//
// Threads: one thread uses a connection; interrupt() may be called from another (the blocked call fails).
// Errors: StateTransferError naming the peer (host:port) and what failed: a connection refused or lost, a
// peer silent for `idle`, an unreadable message, a CRC that differs, a proof of the job's secret that does
// not match (or a secret on one side only).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>

#include "agent/state/state_wire.h"
#include "rendezvous/store/store_auth.h"
#include "rendezvous/util/unique_fd.h"

namespace ddprun::agent {

class StateTransferError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class StateConnection {
 public:
  using Clock = std::chrono::steady_clock;
  // Called before each chunk with the time it may go (--state_bandwidth); returns false to give up (the
  // agent is stopping).
  using Pace = std::function<bool(uint64_t chunk_bytes)>;

  // Connects to host:port within `timeout`.
  static StateConnection connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
                                 std::chrono::milliseconds idle);
  // An accepted connection from `peer`.
  StateConnection(UniqueFd fd, std::string peer, std::chrono::milliseconds idle);

  // The client's side of the opening: proves the job's secret with `auth` (null: an open job) and checks the
  // server's proof.
  void client_handshake(const rdzv::StoreAuth* auth);
  // The server's side; false when the client is refused (it was told why; `why` says it too).
  bool server_handshake(const rdzv::StoreAuth* auth, std::string& why);

  void send(const StateMessage& m);
  StateMessage receive();
  // Sends the first `n` bytes of the file open at `fd`, then "done <crc>"; `pace` (may be empty) before each
  // chunk.
  void send_file(int fd, uint64_t n, const Pace& pace = {});
  // Receives `n` bytes into the file open at `fd` (writable; its room allocated first), then "done <crc>",
  // and checks the CRC.
  void receive_file(int fd, uint64_t n);
  // Receives a version announced as rank `rank`'s step `step` (`n` bytes, receive_file's checks) into the
  // file `tmp` and commits it as `dest` (rename) when its manifest names that rank and step. Returns "" once
  // committed, else why not; throws StateTransferError when the transfer fails. Leaves no `tmp` behind.
  std::string receive_version(int rank, int64_t step, uint64_t n, const std::filesystem::path& tmp,
                              const std::filesystem::path& dest);
  // Makes the call in progress (and every later one) fail.
  void interrupt();
  const std::string& peer() const { return peer_; }

 private:
  void write_all(const void* data, size_t n);
  void read_all(void* data, size_t n);
  void wait_for(short events);
  std::string receive_frame();
  void send_frame(std::string_view body);
  [[noreturn]] void fail(const std::string& what) const;

  UniqueFd fd_;
  std::string peer_;
  std::chrono::milliseconds idle_;
};

}  // namespace ddprun::agent
