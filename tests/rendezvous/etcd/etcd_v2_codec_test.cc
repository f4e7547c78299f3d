// etcd's v2 API as text (rendezvous/etcd/etcd_v2_codec.h): targets, forms and what replies mean, byte by
// byte.
#include "rendezvous/etcd/etcd_v2_codec.h"

#include <string>

#include "catch_compat.h"
#include "error_text.h"

namespace ddprun::rdzv::etcd::v2 {
namespace {

using testing::error_text;

const RequestText kGet{"GET", "/v2/keys/run/a?recursive=true", "/run/a", "10.0.0.1:2379"};

TEST_CASE("etcd v2 codec: keys keep '/' and unreserved bytes, the rest is percent-encoded", "[etcd]") {
  CHECK(normalized_key("a/b") == "/a/b");
  CHECK(normalized_key("/a") == "/a");
  CHECK(normalized_key("") == "/");
  CHECK(keys_path("/torchelastic/p2p/run_x/rdzv/active_version") ==
        "/v2/keys/torchelastic/p2p/run_x/rdzv/active_version");
  CHECK(keys_path("/a b&c=d?e#f%g+h~i.j-k_l") == "/v2/keys/a%20b%26c%3Dd%3Fe%23f%25g%2Bh~i.j-k_l");
  CHECK(keys_path(std::string("/\0\xff\xc3\xa9", 5)) == "/v2/keys/%00%FF%C3%A9");
}

TEST_CASE("etcd v2 codec: forms encode every byte but the unreserved ones, '/' included", "[etcd]") {
  Form form;
  form.add("value", "a/b c&d=e+f\n").add_flag("prevExist", false).add("ttl", "10");
  CHECK(form.text() == "value=a%2Fb%20c%26d%3De%2Bf%0A&prevExist=false&ttl=10");
  CHECK(Form().add("value", "").text() == "value=");
}

TEST_CASE("etcd v2 codec: a reply with a node, its children and X-Etcd-Index", "[etcd]") {
  const std::string body =
      R"({"action":"get","node":{"key":"/run/a","dir":true,"nodes":[{"key":"/run/a/x","value":"1",)"
      R"("expiration":"2026-01-01T00:00:00Z","ttl":7,"modifiedIndex":5,"createdIndex":4}],)"
      R"("modifiedIndex":3,"createdIndex":3},"prevNode":{"key":"/run/a","value":"old","modifiedIndex":2,)"
      R"("createdIndex":2}})";
  std::string leaderless;
  const auto response = read_reply({200, body, "9"}, kGet, leaderless);
  REQUIRE(response.has_value());
  CHECK(response->action == "get");
  CHECK(response->etcd_index == 9);
  CHECK(response->node.dir);
  CHECK(response->node.created_index == 3);
  REQUIRE(response->node.nodes.size() == 1);
  CHECK(response->node.nodes[0].value == "1");
  CHECK(response->node.nodes[0].ttl == 7);
  CHECK(response->node.nodes[0].modified_index == 5);
  REQUIRE(response->prev_node.has_value());
  CHECK(response->prev_node->value == "old");
  CHECK_FALSE(response->node.ttl.has_value());
}

TEST_CASE("etcd v2 codec: error documents", "[etcd]") {
  std::string leaderless;
  try {
    read_reply({404, R"({"errorCode":100,"message":"Key not found","cause":"/run","index":12})", "12"}, kGet,
               leaderless);
    FAIL("no error");
  } catch (const EtcdKeyError& e) {
    CHECK(e.code() == kKeyNotFound);
    CHECK(e.index() == 12);
    CHECK(std::string(e.what()) ==
          "etcd key /run/a: Key not found (/run) [etcd error 100 from 10.0.0.1:2379]");
  }
  const auto none = read_reply({500, R"({"errorCode":300,"message":"Raft Internal Error","index":3})", {}},
                               kGet, leaderless);
  CHECK_FALSE(none.has_value());
  CHECK(leaderless == "etcd error 300: Raft Internal Error");
  CHECK_THROWS_AS(read_reply({400, R"({"errorCode":"x"})", {}}, kGet, leaderless), EtcdProtocolError);
}

TEST_CASE("etcd v2 codec: replies that are not etcd's", "[etcd]") {
  std::string leaderless;
  CHECK(error_text([&] {
          read_reply({404, "404 page not found\n", {}}, kGet, leaderless);
        }) ==
        "10.0.0.1:2379 does not serve etcd's v2 API (HTTP 404 for /v2/keys/run/a): etcd 3.4+ needs "
        "--enable-v2=true");
  CHECK(
      error_text([&] {
        read_reply({200, "<html>\n</html>", {}}, kGet, leaderless);
      }) ==
      "10.0.0.1:2379 is not an etcd v2 member (GET /v2/keys/run/a?recursive=true, key /run/a): HTTP 200, not "
      "JSON: \"<html> </html>\"");
  CHECK_THAT(error_text([&] {
               read_reply({200, R"({"action":"get"})", {}}, kGet, leaderless);
             }),
             Catch::Contains("JSON without etcd's \"action\" and \"node\""));
  CHECK_THAT(error_text([&] {
               read_reply({502, std::string(500, 'x'), {}}, kGet, leaderless);
             }),
             Catch::Contains("HTTP 502, not an etcd reply") && Catch::Contains("xxx...\""));
  CHECK_THAT(error_text([&] {
               read_reply({200, R"({"action":"get","node":{"modifiedIndex":"x"}})", {}}, kGet, leaderless);
             }),
             Catch::Contains("a reply etcd would not send"));
  CHECK_THROWS_AS(read_reply({200, R"({"action":"get","node":{}})", "nine"}, kGet, leaderless),
                  EtcdProtocolError);
  // std::stoull took "-1" for 2^64 - 1 and "9x" for 9: the whole header is a number or the reply is refused.
  for (const char* bad : {"nine", "-1", "9x", " 9"}) {
    CAPTURE(bad);
    CHECK_THAT(error_text([&] {
                 read_reply({200, R"({"action":"get","node":{}})", bad}, kGet, leaderless);
               }),
               Catch::Contains("a reply etcd would not send (X-Etcd-Index '" + std::string(bad) + "')"));
  }
}

TEST_CASE("etcd v2 codec: a watch that ended without an event", "[etcd]") {
  CHECK(is_empty_watch_reply({200, "", {}}));
  CHECK(is_empty_watch_reply({200, "\r\n", {}}));
  CHECK_FALSE(is_empty_watch_reply({200, "{}", {}}));
  CHECK_FALSE(is_empty_watch_reply({500, "", {}}));
}

}  // namespace
}  // namespace ddprun::rdzv::etcd::v2
