// Test support: a real etcd member (/usr/bin/etcd, 3.4) on 127.0.0.1 for integration tests, and certificates
// made with the openssl CLI for its TLS variants. For any test that needs etcd (the v2 client, torchrun's
// etcd rendezvous backends).
//
//   ddprun::testing::EtcdProcess etcd;                    // v2 API on, plain http, free ports
//   ddprun::rdzv::etcd::Client client({.endpoints = {etcd.endpoint()}});
//   etcd.kill();                                          // SIGKILL + waitpid: the member is gone
//   etcd.restart();                                       // the same ports and data dir, ready again
//
// The member's ports are free ones (bound to port 0 first, then released; a start that loses the race to
// another process is retried on new ports); its data directory is a temporary one, removed with it. The
// constructor and restart() return once the member serves clients (its log says "ready to serve client
// requests", which etcd prints once it has a leader and published itself), or fail the current Catch2 test
// (REQUIRE) with the member's log after 30 s. The destructor SIGKILLs the member's process group and reaps
// it. Not thread-safe: one thread drives a fixture (a reader thread of its own collects the member's output).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/store/endpoint.h"
#include "temp_dir.h"

namespace ddprun::testing {

// PEM files for TLS tests, all in one directory: a CA, a server certificate it signed for IP 127.0.0.1
// (server and client use), a client certificate it signed, and an unrelated second CA with a client
// certificate of its own (the "wrong CA" cases).
struct TestPki {
  std::filesystem::path ca_file, ca_key;
  std::filesystem::path server_cert, server_key;
  std::filesystem::path client_cert, client_key;
  std::filesystem::path other_ca_file, other_ca_key;
  std::filesystem::path other_client_cert, other_client_key;  // signed by the other CA
};

// Makes a TestPki in `dir` with the openssl CLI (EC P-256 keys, valid for two days). REQUIRE-fails when
// openssl does.
TestPki make_test_pki(const std::filesystem::path& dir);

// The member's TLS setup (etcd's --cert-file, --key-file, --trusted-ca-file, --client-cert-auth).
struct EtcdTls {
  std::filesystem::path cert_file;
  std::filesystem::path key_file;
  std::filesystem::path trusted_ca_file;  // "" = no --trusted-ca-file
  bool client_cert_auth = false;          // clients must present a certificate that trusted_ca_file signed
};

struct EtcdProcessOptions {
  bool enable_v2 = true;                // --enable-v2 (etcd 3.4 defaults to false)
  std::optional<EtcdTls> tls;           // https on the client port when given
  std::vector<std::string> extra_args;  // more etcd flags
};

class EtcdProcess {
 public:
  explicit EtcdProcess(EtcdProcessOptions options = {});
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // 127.0.0.1 and the client port; the same after restart().
  rdzv::Endpoint endpoint() const { return {"127.0.0.1", client_port_}; }
  // "http://127.0.0.1:port" (https with TLS).
  std::string client_url() const;
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // SIGKILLs the member (its process group) and reaps it. Nothing when it is not running.
  void kill();
  // kill(), then starts the member again with the same ports and data, and waits until it serves clients.
  void restart();
  // What the member printed so far (the current run), for INFO on failures.
  std::string log() const;

 private:
  // Starts etcd on the current ports; true once it serves clients, false when it exited first (port taken).
  bool start();
  void start_on_free_ports();
  void collect_output(int fd);

  EtcdProcessOptions options_;
  TempDir dir_;
  uint16_t client_port_ = 0;
  uint16_t peer_port_ = 0;
  pid_t pid_ = -1;
  std::thread reader_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::string log_;             // guarded by mutex_
  bool output_closed_ = false;  // guarded by mutex_
};

// A free TCP port on 127.0.0.1 (bound to port 0 then released): for a server the test starts itself.
uint16_t free_port();

}  // namespace ddprun::testing
