// SharedValue: a stored value as an immutable buffer, shared by the store and the replies that carry it.
//
// The store (KeyValueState) holds one per key; a reply or a notification that carries the value references
// the same buffer instead of copying it (ReplyQueue), so 1000 clients reading one 8 MiB value, or 100
// watchers of a key set five times, cost each value once, not once per reader. A buffer lives as long as the
// store or a queued reply still references it. Single-threaded, like everything that shares one (the server's
// io_context thread): the reference count is not a synchronisation point.
#pragma once

#include <memory>
#include <string>

namespace ddprun::rdzv {

// Never null where a value exists; an empty (null) SharedValue means "no value".
using SharedValue = std::shared_ptr<const std::string>;

// The one way values are made. The string is created non-const, so that its owner may overwrite or append to
// it in place while no one else references it (use_count() == 1: KeyValueState::store and append), which no
// queued reply can see: a SET or ADD of a key nobody is being sent costs what it cost before values were
// shared.
inline SharedValue make_shared_value(std::string bytes) {
  return std::make_shared<std::string>(std::move(bytes));
}

}  // namespace ddprun::rdzv
