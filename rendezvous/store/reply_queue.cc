#include "rendezvous/store/reply_queue.h"

#include <cstdlib>
#include <utility>

namespace ddprun::rdzv {

void SharedBytes::add(const std::string& v) {
  if (refs_[&v]++ == 0) bytes_ += v.size();
}

void SharedBytes::release(const std::string& v) {
  auto it = refs_.find(&v);
  if (it == refs_.end()) std::abort();  // a release without its add: the accounting is broken
  if (--it->second == 0) {
    bytes_ -= v.size();
    refs_.erase(it);
  }
}

void ReplyQueue::raw(const void* p, size_t n) {
  owned_.append(static_cast<const char*>(p), n);
  size_ += n;
}

void ReplyQueue::bytes(std::string_view v) {
  const uint64_t n = v.size();
  raw(&n, sizeof n);
  raw(v.data(), v.size());
}

void ReplyQueue::bytes(const SharedValue& v) {
  if (!v || v->size() < share_at_) {
    bytes(v ? std::string_view(*v) : std::string_view());
    return;
  }
  const uint64_t n = v->size();
  raw(&n, sizeof n);
  if (ledger_) ledger_->add(*v);
  shared_.push_back(Shared{owned_.size(), v});
  size_ += v->size();
}

size_t ReplyQueue::pieces() const {
  size_t n = 0;
  for_each_piece([&n](const char*, size_t) { ++n; });
  return n;
}

void ReplyQueue::clear() {
  if (ledger_) for_each_shared([this](const std::string& s) { ledger_->release(s); });
  shared_.clear();
  if (shared_.capacity() > 16) std::vector<Shared>().swap(shared_);  // a long queue's memory goes back too
  std::string().swap(owned_);  // an idle connection holds no reply buffer
  size_ = 0;
}

void ReplyQueue::swap(ReplyQueue& other) {
  if (ledger_ != other.ledger_) std::abort();  // each queue's references are on its own ledger
  std::swap(share_at_, other.share_at_);
  owned_.swap(other.owned_);
  shared_.swap(other.shared_);
  std::swap(size_, other.size_);
}

std::string ReplyQueue::flatten() const {
  std::string out;
  out.reserve(size_);
  for_each_piece([&out](const char* p, size_t n) { out.append(p, n); });
  return out;
}

}  // namespace ddprun::rdzv
