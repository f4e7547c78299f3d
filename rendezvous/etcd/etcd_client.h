// EtcdClient: etcd's v2 keys API (/v2/keys) over HTTP/1.1 or HTTPS, as python-etcd speaks it — what
// torchrun's etcd and etcd-v2 rendezvous backends use. Boost.Beast does the HTTP, OpenSSL the TLS;
// nlohmann-json reads the replies. No HTTP is parsed by hand.
//
// Members: a client is given every member it may talk to (--rdzv_endpoint "host1:2379,host2:2379"). A request
// (get, write, remove) goes to the member that answered last (the first one at the start); when that member
// cannot be reached, does not answer within the request timeout, closes the connection, or answers that the
// cluster has no leader (etcd error codes 300-302), the same request goes to the next member, round the list;
// when every member failed, the list is tried again every 200 ms (a leader election takes about a second)
// until the request timeout has passed since the call began: then EtcdUnavailableError names each member and
// what went wrong in the last round. A compare-and-swap that timed out on one member and succeeded there
// anyway is reported as a compare failure on the retry (etcd's own behaviour for python-etcd too); callers
// re-read and decide. One keep-alive connection to the current member is reused between requests
// (member_connection.h).
//
// Keys are paths ("/torchelastic/p2p/run_x/rdzv/active_version"); a key without a leading '/' gets one. They
// are sent as they are, '/' included (as python-etcd does); other bytes outside [A-Za-z0-9-._~/] are
// percent-encoded. Values are arbitrary bytes (form-encoded in the request body).
//
// Threads: one request at a time per client (methods are not thread-safe); use one client per thread. The
// destructor closes the connection. Every method blocks for at most its deadline: the request timeout for one
// request on one member times the members tried, or the watch's own timeout.
//
// Errors (all derive from StoreError, store_error.h, so that the rendezvous boundary reports them):
//   EtcdKeyError          etcd answered with an error document ({"errorCode":100,...}): key not found,
//                         compare failed, node exists, ... — an answer, never retried on another member.
//   EtcdUnavailableError  no member answered (ConnectionLostError): every endpoint and its failure in the
//                         text.
//   EtcdProtocolError     a member answered, but not as etcd's v2 API does (BadReplyError): a 404 for
//                         /v2/keys (etcd 3.4+ without --enable-v2=true: the message says so), another HTTP
//                         server, a reply that is not the JSON etcd sends. Names the endpoint, the key and
//                         the status.
//   EtcdTlsError          the TLS handshake failed (StoreError): the server's certificate is not signed by
//                         the CA given, the client certificate was refused, a PEM file cannot be read; names
//                         the endpoint and OpenSSL's reason.
//   TimeoutError          never: a watch that times out returns nullopt.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/store/endpoint.h"
#include "rendezvous/store/store_error.h"

namespace ddprun::rdzv::etcd {

// TLS material, as files (PEM). Empty strings: not given.
struct TlsFiles {
  std::string ca_file;    // the CA that signed the members' certificates ("" = OpenSSL's default paths)
  std::string cert_file;  // this client's certificate, for members that ask for one
  std::string key_file;   // its private key ("" = in cert_file)
};

struct ClientOptions {
  std::vector<Endpoint> endpoints;  // at least one member
  bool https = false;               // --rdzv_conf protocol=https (etcd) / ssl_cert... given (etcd-v2)
  TlsFiles tls;
  // One request on one member: connect, TLS handshake, send, whole reply. Not for watch(), which has its own.
  std::chrono::milliseconds request_timeout{5000};
};

// One node of etcd's tree, as a reply carries it.
struct Node {
  std::string key;
  bool dir = false;
  std::string value;  // "" for a directory
  uint64_t created_index = 0;
  uint64_t modified_index = 0;
  std::optional<int64_t> ttl;  // seconds left, for a node that expires
  std::vector<Node> nodes;     // a directory's children when the reply lists them
};

struct Response {
  std::string action;  // "get", "set", "create", "update", "compareAndSwap", "delete", "compareAndDelete",
                       // "expire" (watch), ...
  Node node;
  std::optional<Node> prev_node;
  uint64_t etcd_index = 0;  // the X-Etcd-Index header: the cluster's index when the reply was made
};

struct GetOptions {
  bool recursive = false;  // list a directory's whole subtree (else only its children)
  bool quorum = false;     // read through the leader (else any member may answer from its own copy)
};

// A write (HTTP PUT). Leaving everything unset is a plain set.
struct WriteOptions {
  std::optional<bool> prev_exist;         // true: only update an existing key; false: only create
  std::optional<std::string> prev_value;  // compare-and-swap on the value
  std::optional<uint64_t> prev_index;     // compare-and-swap on the modified index
  std::optional<int64_t> ttl;             // seconds; the node expires unless written or refreshed again
  bool dir = false;                       // create a directory (value ignored)
  bool refresh = false;                   // only reset the TTL (value not sent; prev_exist implied)
};

struct DeleteOptions {
  std::optional<std::string> prev_value;  // compare-and-delete
  std::optional<uint64_t> prev_index;
  bool dir = false;
  bool recursive = false;
};

// etcd v2's error codes that the rendezvous protocols branch on.
enum ErrorCode : int {
  kKeyNotFound = 100,
  kTestFailed = 101,  // compare failed
  kNotFile = 102,
  kNotDir = 104,
  kNodeExist = 105,
  kDirNotEmpty = 108,
  kRaftInternal = 300,
  kLeaderElect = 301,
  kEventIndexCleared = 401,
};

class EtcdKeyError : public StoreError {
 public:
  EtcdKeyError(const std::string& what, int code, uint64_t index)
      : StoreError(what), code_(code), index_(index) {}
  int code() const { return code_; }
  uint64_t index() const { return index_; }  // the cluster's index the error document carries

 private:
  int code_;
  uint64_t index_;
};

class EtcdUnavailableError : public ConnectionLostError {
 public:
  using ConnectionLostError::ConnectionLostError;
};

class EtcdProtocolError : public BadReplyError {
 public:
  using BadReplyError::BadReplyError;
};

class EtcdTlsError : public StoreError {
 public:
  using StoreError::StoreError;
};

class Client {
 public:
  // Connects lazily (the first request). Throws std::invalid_argument for no endpoints; EtcdTlsError when a
  // PEM file given cannot be read.
  explicit Client(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  Response get(const std::string& key, const GetOptions& options = {});
  Response write(const std::string& key, const std::string& value, const WriteOptions& options = {});
  Response remove(const std::string& key, const DeleteOptions& options = {});
  // Long-polls for the first change of `key` (or, recursive, anything under it) at index >= wait_index
  // (?wait=true&waitIndex=N). Returns nullopt when nothing changed within `timeout`. A member lost during the
  // watch: the watch goes on at the next member with the same index, within the same timeout. EtcdKeyError
  // kEventIndexCleared when wait_index is older than etcd's history (1000 events): re-read, then watch again.
  std::optional<Response> watch(const std::string& key, uint64_t wait_index, bool recursive,
                                std::chrono::milliseconds timeout);

  // The member the last request went to ("host:port"), for messages.
  std::string current_endpoint() const;
  // "host1:2379,host2:2379" as given, for messages.
  std::string endpoints_text() const;
  const ClientOptions& options() const { return options_; }

 private:
  struct Impl;
  ClientOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rdzv::etcd
