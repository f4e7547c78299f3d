#include "etcd_process.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>

#include "catch_compat.h"
#include "child_processes.h"

namespace ddprun::testing {
namespace {

using namespace std::chrono_literals;

constexpr auto kStartLimit = 30s;

// A socket bound to a free port of 127.0.0.1 (kept open, so that the next call gets another port).
int bind_free(uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  port = ntohs(addr.sin_port);
  return fd;
}

void run_openssl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<Child> children;
  children.push_back(spawn_child(argv, {}));
  wait_children(children, std::chrono::seconds(60));
  INFO("openssl " << args.front() << ": " << children[0].output);
  REQUIRE(children[0].exit_code == 0);
}

}  // namespace

uint16_t free_port() {
  uint16_t port = 0;
  ::close(bind_free(port));
  return port;
}

TestPki make_test_pki(const std::filesystem::path& dir) {
  const std::string cnf = (dir / "openssl.cnf").string();
  std::ofstream(cnf) << "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = ddprun-test\n"
                        "[ca]\nbasicConstraints = critical,CA:TRUE\nkeyUsage = critical,keyCertSign,cRLSign\n"
                        "subjectKeyIdentifier = hash\n"
                        "[server]\nbasicConstraints = CA:FALSE\nkeyUsage = critical,digitalSignature\n"
                        "extendedKeyUsage = serverAuth,clientAuth\nsubjectAltName = IP:127.0.0.1\n"
                        "[client]\nbasicConstraints = CA:FALSE\nkeyUsage = critical,digitalSignature\n"
                        "extendedKeyUsage = clientAuth\n";
  auto path = [&](const char* name) { return dir / name; };
  TestPki pki{path("ca.pem"),           path("ca.key"),          path("server.pem"),   path("server.key"),
              path("client.pem"),       path("client.key"),      path("other-ca.pem"), path("other-ca.key"),
              path("other-client.pem"), path("other-client.key")};
  const std::vector<std::string> ec_key = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                           "-nodes"};
  auto make_ca = [&](const std::filesystem::path& cert, const std::filesystem::path& key, const char* cn) {
    std::vector<std::string> args = {"req", "-x509", "-config", cnf, "-extensions", "ca"};
    args.insert(args.end(), ec_key.begin(), ec_key.end());
    args.insert(args.end(), {"-keyout", key.string(), "-out", cert.string(), "-days", "2", "-subj", cn});
    run_openssl(args);
  };
  auto make_signed = [&](const std::filesystem::path& cert, const std::filesystem::path& key, const char* cn,
                         const char* extensions, const std::filesystem::path& ca,
                         const std::filesystem::path& ca_key) {
    const std::string csr = cert.string() + ".csr";
    std::vector<std::string> args = {"req", "-new", "-config", cnf};
    args.insert(args.end(), ec_key.begin(), ec_key.end());
    args.insert(args.end(), {"-keyout", key.string(), "-out", csr, "-subj", cn});
    run_openssl(args);
    run_openssl({"x509", "-req", "-in", csr, "-CA", ca.string(), "-CAkey", ca_key.string(), "-CAcreateserial",
                 "-out", cert.string(), "-days", "2", "-extfile", cnf, "-extensions", extensions});
  };
  make_ca(pki.ca_file, pki.ca_key, "/CN=ddprun-test-ca");
  make_signed(pki.server_cert, pki.server_key, "/CN=127.0.0.1", "server", pki.ca_file, pki.ca_key);
  make_signed(pki.client_cert, pki.client_key, "/CN=ddprun-test-client", "client", pki.ca_file, pki.ca_key);
  make_ca(pki.other_ca_file, pki.other_ca_key, "/CN=ddprun-other-ca");
  make_signed(pki.other_client_cert, pki.other_client_key, "/CN=ddprun-other-client", "client",
              pki.other_ca_file, pki.other_ca_key);
  return pki;
}

EtcdProcess::EtcdProcess(EtcdProcessOptions options) : options_(std::move(options)) {
  try {
    start_on_free_ports();
  } catch (...) {
    kill();  // a failed test: no member, no reader thread left behind
    throw;
  }
}

void EtcdProcess::start_on_free_ports() {
  for (int tries = 0; tries < 5; ++tries) {
    const int client_fd = bind_free(client_port_);
    const int peer_fd = bind_free(peer_port_);
    ::close(client_fd);
    ::close(peer_fd);
    if (start()) return;
    const std::string text = log();
    kill();
    INFO("etcd did not start:\n" << text);
    REQUIRE(text.find("address already in use") != std::string::npos);  // else not a lost race: fail
  }
  FAIL("etcd did not start in 5 tries: its ports were taken each time");
}

EtcdProcess::~EtcdProcess() {
  kill();
}

std::string EtcdProcess::client_url() const {
  return std::string(options_.tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(client_port_);
}

std::string EtcdProcess::log() const {
  std::lock_guard lock(mutex_);
  return log_;
}

bool EtcdProcess::start() {
  const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer_port_);
  std::vector<std::string> argv = {"/usr/bin/etcd",
                                   "--name=default",
                                   "--data-dir=" + (dir_.path / "data").string(),
                                   "--listen-client-urls=" + client_url(),
                                   "--advertise-client-urls=" + client_url(),
                                   "--listen-peer-urls=" + peer_url,
                                   "--initial-advertise-peer-urls=" + peer_url,
                                   "--initial-cluster=default=" + peer_url,
                                   std::string("--enable-v2=") + (options_.enable_v2 ? "true" : "false")};
  if (options_.tls) {
    argv.push_back("--cert-file=" + options_.tls->cert_file.string());
    argv.push_back("--key-file=" + options_.tls->key_file.string());
    if (!options_.tls->trusted_ca_file.empty()) {
      argv.push_back("--trusted-ca-file=" + options_.tls->trusted_ca_file.string());
    }
    if (options_.tls->client_cert_auth) argv.push_back("--client-cert-auth=true");
  }
  argv.insert(argv.end(), options_.extra_args.begin(), options_.extra_args.end());
  {
    std::lock_guard lock(mutex_);
    log_.clear();
    output_closed_ = false;
  }
  const Child child = spawn_child(argv, {"ETCD_UNSUPPORTED_ARCH="});
  pid_ = child.pid;
  reader_ = std::thread([this, fd = child.fd] { collect_output(fd); });
  std::unique_lock lock(mutex_);
  const bool ready = changed_.wait_for(lock, kStartLimit, [&] {
    return output_closed_ || log_.find("ready to serve client requests") != std::string::npos;
  });
  INFO("etcd's log:\n" << log_);
  REQUIRE(ready);  // neither ready nor exited within the limit
  return !output_closed_;
}

void EtcdProcess::collect_output(int fd) {
  char buf[4096];
  for (;;) {
    const ssize_t k = ::read(fd, buf, sizeof buf);
    if (k < 0 && errno == EINTR) continue;
    std::lock_guard lock(mutex_);
    if (k <= 0) {
      output_closed_ = true;
      changed_.notify_all();
      break;
    }
    log_.append(buf, static_cast<size_t>(k));
    changed_.notify_all();
  }
  ::close(fd);
}

void EtcdProcess::kill() {
  if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  if (reader_.joinable()) reader_.join();
}

void EtcdProcess::restart() {
  kill();
  INFO("etcd did not restart on its ports:\n" << log());
  REQUIRE(start());
}

}  // namespace ddprun::testing
