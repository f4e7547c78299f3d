#include "rendezvous/store/store_probe.h"

#include <algorithm>
#include <utility>

#include "rendezvous/store/store_error.h"

namespace ddprun::rdzv {

StoreClientOptions probe_options(std::chrono::milliseconds connect_timeout, std::chrono::milliseconds timeout,
                                 std::shared_ptr<const StoreAuth> auth, bool observer) {
  StoreClientOptions o;
  o.connect_timeout = std::min(connect_timeout, kMaxProbeConnectTimeout);
  o.timeout = timeout;
  o.auth = std::move(auth);
  o.observer = observer;
  return o;
}

std::unique_ptr<StoreClient> probe_store(const Endpoint& store, const StoreClientOptions& options,
                                         std::string* why) {
  try {
    return std::make_unique<StoreClient>(store.host, store.port, options);
  } catch (const StoreError& e) {
    if (why) *why = e.what();
  }
  return nullptr;
}

}  // namespace ddprun::rdzv
