// EtcdClient (rendezvous/etcd/etcd_client.h) over TLS, against a real etcd 3.4 member that requires client
// certificates (etcd_process.h; certificates made with the openssl CLI): the right CA and certificate work,
// watches included; a CA that did not sign the member, no client certificate, a client certificate from
// another CA, plain http to a TLS member and https to a plain one are each EtcdTlsError naming the member and
// the reason; a PEM file that cannot be read fails the constructor, naming the file.
#include <filesystem>
#include <string>

#include "catch_compat.h"
#include "etcd_client_fixture.h"
#include "etcd_process.h"
#include "rendezvous/etcd/etcd_client.h"
#include "temp_dir.h"

namespace ddprun::rdzv::etcd {
namespace {

using namespace client_fixture;
using testing::EtcdProcess;

struct TlsMember {
  testing::TempDir dir;
  testing::TestPki pki = testing::make_test_pki(dir.path);
  EtcdProcess etcd{tls_options(pki)};

  static testing::EtcdProcessOptions tls_options(const testing::TestPki& pki) {
    testing::EtcdProcessOptions options;
    options.tls = testing::EtcdTls{pki.server_cert, pki.server_key, pki.ca_file, true};
    return options;
  }
  ClientOptions client_options(const std::filesystem::path& ca, const std::filesystem::path& cert,
                               const std::filesystem::path& key) const {
    ClientOptions options = options_for({etcd.endpoint()});
    options.https = true;
    options.tls = {ca.string(), cert.string(), key.string()};
    return options;
  }
};

TEST_CASE("etcd over TLS: certificates right, wrong, missing", "[etcd][tls]") {
  TlsMember member;
  const testing::TestPki& pki = member.pki;
  const std::string name = member.etcd.endpoint().to_string();

  SECTION("the right CA and a client certificate: it works") {
    Client client(member.client_options(pki.ca_file, pki.client_cert, pki.client_key));
    CHECK(client.write("/t/tls/k", "secret").action == "set");
    CHECK(client.get("/t/tls/k").node.value == "secret");
    const auto nothing = client.watch("/t/tls/k", client.get("/t/tls/k").etcd_index + 1, false, 200ms);
    CHECK_FALSE(nothing.has_value());
    CHECK(client.get("/t/tls/k").node.value == "secret");
  }
  SECTION("a CA that did not sign the member's certificate: certificate verify failed") {
    Client client(member.client_options(pki.other_ca_file, pki.client_cert, pki.client_key));
    std::string message;
    try {
      client.get("/t/tls/k");
      FAIL("a member with an unknown CA was trusted");
    } catch (const EtcdTlsError& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::Contains(name) && Catch::Contains("certificate verify failed"));
  }
  SECTION("no client certificate for a member that requires one") {
    Client client(member.client_options(pki.ca_file, "", ""));
    std::string message;
    try {
      client.get("/t/tls/k");
      FAIL("a member that requires a client certificate answered without one");
    } catch (const EtcdTlsError& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::Contains(name) && Catch::Contains("requires a client certificate"));
  }
  SECTION("a client certificate from another CA") {
    Client client(member.client_options(pki.ca_file, pki.other_client_cert, pki.other_client_key));
    const std::string message = error_text([&] { client.get("/t/tls/k"); });
    CHECK_THROWS_AS(client.get("/t/tls/k"), EtcdTlsError);
    CHECK_THAT(message, Catch::Contains(name) && Catch::Contains("refused the client certificate"));
  }
  SECTION("plain http to a TLS member, https to a plain one") {
    Client plain(options_for({member.etcd.endpoint()}));
    const std::string to_tls = error_text([&] { plain.get("/t/tls/k"); });
    CHECK_THAT(to_tls, Catch::Contains(name));
    ClientOptions https = member.client_options(pki.ca_file, pki.client_cert, pki.client_key);
    https.endpoints = {shared_etcd().endpoint()};
    Client tls_to_plain(https);
    CHECK_THROWS_AS(tls_to_plain.get("/t/tls/k"), EtcdTlsError);
  }
}

TEST_CASE("etcd over TLS: a PEM file that cannot be read fails the constructor", "[etcd][tls]") {
  testing::TempDir dir;
  ClientOptions options = options_for({{"127.0.0.1", 1}});
  options.https = true;
  options.tls.ca_file = (dir.path / "missing-ca.pem").string();
  std::string message;
  try {
    Client client(options);
    FAIL("a client with a missing CA file was made");
  } catch (const EtcdTlsError& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains(options.tls.ca_file) && Catch::Contains("No such file"));

  options.tls.ca_file = dir.write("garbage.pem", "not a certificate\n").string();
  message = error_text([&] { Client client(options); });
  CHECK_THAT(message, Catch::Contains(options.tls.ca_file));
  CHECK_THROWS_AS(Client(options), EtcdTlsError);

  options.tls.ca_file = "";
  options.tls.cert_file = (dir.path / "missing-cert.pem").string();
  CHECK_THAT(error_text([&] { Client client(options); }), Catch::Contains(options.tls.cert_file));
}

}  // namespace
}  // namespace ddprun::rdzv::etcd
