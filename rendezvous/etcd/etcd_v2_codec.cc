#include "rendezvous/etcd/etcd_v2_codec.h"

#include <exception>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv::etcd::v2 {
namespace {

constexpr std::size_t kBodyInMessages = 120;  // bytes of a reply that is not etcd's quoted in the message

void append_encoded(std::string& out, std::string_view bytes, bool keep_slash) {
  static const char* const kHex = "0123456789ABCDEF";
  for (const char ch : bytes) {
    const auto c = static_cast<unsigned char>(ch);
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                            c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/');
    if (unreserved) {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
}

Node parse_node(const nlohmann::json& j) {
  Node node;
  node.key = j.value("key", std::string());
  node.dir = j.value("dir", false);
  node.value = j.value("value", std::string());
  node.created_index = j.value("createdIndex", uint64_t{0});
  node.modified_index = j.value("modifiedIndex", uint64_t{0});
  if (j.contains("ttl")) node.ttl = j.at("ttl").get<int64_t>();
  if (j.contains("nodes")) {
    for (const auto& child : j.at("nodes")) node.nodes.push_back(parse_node(child));
  }
  return node;
}

}  // namespace

std::string normalized_key(const std::string& key) {
  return key.empty() || key[0] != '/' ? "/" + key : key;
}

std::string keys_path(const std::string& normalized) {
  std::string path = "/v2/keys";
  append_encoded(path, normalized, true);
  return path;
}

Form& Form::add(std::string_view name, std::string_view value) {
  if (!text_.empty()) text_ += '&';
  append_encoded(text_, name, false);
  text_ += '=';
  append_encoded(text_, value, false);
  return *this;
}

bool is_empty_watch_reply(const Reply& reply) {
  return reply.status == 200 && reply.body.find_first_not_of(" \r\n") == std::string_view::npos;
}

std::optional<Response> read_reply(const Reply& reply, const RequestText& request, std::string& leaderless) {
  const std::string& member = request.member;
  auto not_etcd = [&](const std::string& why) {
    std::string body(reply.body.substr(0, kBodyInMessages));
    for (char& c : body) {
      if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    }
    const bool cut = reply.body.size() > kBodyInMessages;
    return EtcdProtocolError(member + " is not an etcd v2 member (" + request.method + " " + request.target +
                             ", key " + request.key + "): HTTP " + std::to_string(reply.status) + ", " + why +
                             (body.empty() ? "" : ": \"" + body + (cut ? "...\"" : "\"")));
  };
  const nlohmann::json doc = nlohmann::json::parse(reply.body, nullptr, false);
  if (doc.is_object() && doc.contains("errorCode")) {
    int code = 0;
    std::string message, cause;
    uint64_t index = 0;
    try {
      code = doc.at("errorCode").get<int>();
      message = doc.value("message", std::string());
      cause = doc.value("cause", std::string());
      index = doc.value("index", uint64_t{0});
    } catch (const nlohmann::json::exception& e) {
      throw not_etcd(std::string("an error document that is not etcd's (") + e.what() + ")");
    }
    const std::string what = message + (cause.empty() ? "" : " (" + cause + ")");
    if (code >= kRaftInternal && code <= 302) {  // 302: the leader changed during the request
      leaderless = "etcd error " + std::to_string(code) + ": " + what;
      return std::nullopt;
    }
    throw EtcdKeyError("etcd key " + request.key + ": " + what + " [etcd error " + std::to_string(code) +
                           " from " + member + "]",
                       code, index);
  }
  if (reply.status == 404 && request.target.rfind("/v2/", 0) == 0) {
    throw EtcdProtocolError(member + " does not serve etcd's v2 API (HTTP 404 for " +
                            request.target.substr(0, request.target.find('?')) +
                            "): etcd 3.4+ needs --enable-v2=true");
  }
  if (reply.status / 100 != 2) throw not_etcd("not an etcd reply");
  if (!doc.is_object() || !doc.contains("action") || !doc.contains("node")) {
    throw not_etcd(doc.is_discarded() ? "not JSON" : "JSON without etcd's \"action\" and \"node\"");
  }
  try {
    Response response;
    response.action = doc.at("action").get<std::string>();
    response.node = parse_node(doc.at("node"));
    if (doc.contains("prevNode")) response.prev_node = parse_node(doc.at("prevNode"));
    if (reply.etcd_index) {
      const auto index = parse_uint(*reply.etcd_index);
      if (!index) throw std::invalid_argument("X-Etcd-Index '" + printable(*reply.etcd_index) + "'");
      response.etcd_index = *index;
    }
    return response;
  } catch (const std::exception& e) {
    throw not_etcd(std::string("a reply etcd would not send (") + e.what() + ")");
  }
}

}  // namespace ddprun::rdzv::etcd::v2
