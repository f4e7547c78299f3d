#include "rendezvous/store/prefix_store.h"

namespace ddprun::rdzv {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : Store(base->timeout()), prefix_(std::move(prefix)), base_(std::move(base)) {}

std::string PrefixStore::key(std::string_view k) const {
  std::string out;
  out.reserve(prefix_.size() + 1 + k.size());
  return out.append(prefix_).append("/").append(k);
}

std::vector<std::string> PrefixStore::keys(const std::vector<std::string>& ks) const {
  std::vector<std::string> out;
  out.reserve(ks.size());
  for (const auto& k : ks) out.push_back(key(k));
  return out;
}

void PrefixStore::set(std::string_view k, std::string_view value) {
  base_->set(key(k), value);
}
std::string PrefixStore::get(std::string_view k) {
  return base_->get(key(k));
}
int64_t PrefixStore::add(std::string_view k, int64_t delta) {
  return base_->add(key(k), delta);
}
std::string PrefixStore::compare_set(std::string_view k, std::string_view expected,
                                     std::string_view desired) {
  return base_->compare_set(key(k), expected, desired);
}
bool PrefixStore::check(const std::vector<std::string>& ks) {
  return base_->check(keys(ks));
}
void PrefixStore::wait(const std::vector<std::string>& ks, std::chrono::milliseconds timeout) {
  base_->wait(keys(ks), timeout);
}
bool PrefixStore::delete_key(std::string_view k) {
  return base_->delete_key(key(k));
}
int64_t PrefixStore::num_keys() {
  return base_->num_keys();
}
void PrefixStore::append(std::string_view k, std::string_view value) {
  base_->append(key(k), value);
}
std::vector<std::string> PrefixStore::multi_get(const std::vector<std::string>& ks) {
  return base_->multi_get(keys(ks));
}
void PrefixStore::multi_set(const std::vector<std::string>& ks, const std::vector<std::string>& values) {
  base_->multi_set(keys(ks), values);
}

}  // namespace ddprun::rdzv
