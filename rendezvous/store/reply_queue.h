// The bytes a store owes one client, queued without copying the large values in them (shared_value.h).
//
// ReplyQueue: one client's pending reply bytes, in order, as pieces: small fields copied into the queue
// (owned), values of share_at bytes or more referenced (shared). The copied bytes are one string, as a plain
// reply buffer, so that small replies cost no more than before values were shared; the referenced values are
// kept with their place in it. A server writes the pieces with one gathering write (for_each_piece); tests
// and the fuzzer read them back with flatten().
//
// SharedBytes: the ledger of the buffers that queues reference, shared by every queue of one server: each
// distinct buffer counts once however many queues (or pieces of one queue) reference it. The server's memory
// budget counts bytes() plus every queue's owned_bytes().
//
// Single-threaded: a ReplyQueue, its ledger and the buffers' owner (the store) are touched from one thread
// (the server's io_context). A queue must not outlive its ledger. Nothing throws but std::bad_alloc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "rendezvous/store/shared_value.h"

namespace ddprun::rdzv {

class SharedBytes {
 public:
  SharedBytes() = default;
  SharedBytes(const SharedBytes&) = delete;
  SharedBytes& operator=(const SharedBytes&) = delete;

  // One more queued reference to `v`; the first one adds its size to bytes(). `v` must not change size while
  // referenced (SharedValue's contract).
  void add(const std::string& v);
  // One reference fewer; the last one takes its size off bytes().
  void release(const std::string& v);

  // Distinct bytes referenced by queues now, each buffer counted once.
  size_t bytes() const { return bytes_; }
  size_t buffers() const { return refs_.size(); }

 private:
  std::unordered_map<const std::string*, size_t> refs_;  // buffer -> references from queues
  size_t bytes_ = 0;
};

class ReplyQueue {
 public:
  // Values this large or larger are referenced; smaller ones are cheaper to copy.
  static constexpr size_t kShareAtBytes = 4096;

  // `ledger` (may be null: nothing is accounted) counts the buffers this queue references.
  explicit ReplyQueue(SharedBytes* ledger = nullptr, size_t share_at = kShareAtBytes)
      : ledger_(ledger), share_at_(share_at) {}
  ~ReplyQueue() { clear(); }
  ReplyQueue(const ReplyQueue&) = delete;
  ReplyQueue& operator=(const ReplyQueue&) = delete;

  // Fields in wire format (wire_codec.h's WireWriter, for a queue).
  void u8(uint8_t v) { raw(&v, sizeof v); }
  void u32(uint32_t v) { raw(&v, sizeof v); }
  void i64(int64_t v) { raw(&v, sizeof v); }
  // A string: u64 length, then a copy of its bytes.
  void bytes(std::string_view v);
  // A string: u64 length, then its bytes: referenced when `v` has share_at bytes or more, else copied. A null
  // `v` is the empty string.
  void bytes(const SharedValue& v);

  // Bytes the client will read, shared ones included.
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Of size(), the bytes this queue holds copies of (the rest are references to shared buffers).
  size_t owned_bytes() const { return owned_.size(); }
  // How many pieces for_each_piece() walks: runs of copied bytes and referenced values.
  size_t pieces() const;

  // Drops everything queued, releasing its references and its memory.
  void clear();
  // Exchanges the contents of two queues of the same ledger.
  void swap(ReplyQueue& other);

  // Calls fn(const char* data, size_t size) for each piece, in order. The pointers stay valid until the queue
  // is next changed.
  template <class Fn>
  void for_each_piece(Fn&& fn) const {
    size_t from = 0;
    for (const Shared& s : shared_) {
      if (s.at > from) fn(owned_.data() + from, s.at - from);
      fn(s.value->data(), s.value->size());
      from = s.at;
    }
    if (owned_.size() > from) fn(owned_.data() + from, owned_.size() - from);
  }
  // Calls fn(const std::string& buffer) for each referenced value (a buffer referenced twice is seen twice).
  template <class Fn>
  void for_each_shared(Fn&& fn) const {
    for (const Shared& s : shared_) fn(*s.value);
  }
  // Every queued byte in one string (tests, the fuzzer).
  std::string flatten() const;

 private:
  struct Shared {
    size_t at;          // goes out after the first `at` bytes of owned_
    SharedValue value;  // never null
  };
  void raw(const void* p, size_t n);

  SharedBytes* ledger_;
  size_t share_at_;
  std::string owned_;           // every copied byte, in order
  std::vector<Shared> shared_;  // the referenced values, by place in owned_ (non-decreasing)
  size_t size_ = 0;
};

}  // namespace ddprun::rdzv
