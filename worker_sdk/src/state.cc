// ddprun::sdk::state: save, wait, load (ddprun/state.h). The file format is rendezvous/util/state_format.h's;
// the rules (two newest kept, the quota, the agreement) are those of Python's ddprun.state
// (agent/state/python/ddprun/state.py), which writes and reads the same files.
#include "ddprun/state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "rendezvous/store/store_error.h"
#include "rendezvous/util/state_format.h"
#include "rendezvous/util/text_util.h"
#include "state_agreement.h"

namespace ddprun::sdk::state {

// Fills a Version (its members are private to the public header).
struct VersionAccess {
  static Version make(const Manifest& m, std::shared_ptr<const void> mapping, const char* base) {
    Version v;
    v.step_ = m.step;
    v.attempt_ = m.attempt;
    v.writer_ = m.writer;
    for (const TensorEntry& t : m.tensors) {
      v.tensors_.push_back({t.name, t.dtype, t.shape, t.device, base + t.offset, t.nbytes});
    }
    v.mapping_ = std::move(mapping);
    return v;
  }
};

const TensorView* Version::find(std::string_view name) const {
  for (const TensorView& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {

namespace fs = std::filesystem;

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

long long env_int(const char* name, long long fallback, long long lo, long long hi) {
  const char* v = env(name);
  if (!v) return fallback;
  const auto x = parse_int_in<long long>(v, lo, hi);
  if (!x) {
    throw StateError("ddprun::sdk::state: " + std::string(name) + "='" + printable(v) +
                     "' is not an integer in " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  return *x;
}

struct Ids {
  int rank = 0, world = 1, attempt = 0;
};

Ids ids() {
  Ids i;
  i.world = static_cast<int>(env_int("WORLD_SIZE", 1, 1, 1 << 24));
  i.rank = static_cast<int>(env_int("RANK", 0, 0, i.world - 1));
  i.attempt = static_cast<int>(env_int("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 30));
  return i;
}

std::string mib(uint64_t n) {
  char out[32];
  std::snprintf(out, sizeof out, "%.1f MiB", static_cast<double>(n) / (1 << 20));
  return out;
}

std::string errno_text(int e) {
  return std::strerror(e);
}

// Bytes of the two newest committed versions other than `step`'s (which the new one replaces): what stays
// while a version is written.
uint64_t kept_bytes(const fs::path& dir, int rank, int64_t step) {
  auto all = list_versions(dir, rank);
  std::erase_if(all, [&](const StoredVersion& v) { return v.name.step == step; });
  uint64_t sum = 0;
  for (size_t i = all.size() > 2 ? all.size() - 2 : 0; i < all.size(); ++i) sum += all[i].bytes;
  return sum;
}

// The manifest of a version of `buffers` (offsets aligned as the Python writer's) and its trailer.
struct Plan {
  Manifest manifest;
  std::string trailer;
  uint64_t total() const { return manifest.payload + trailer.size(); }
};

Plan plan(int64_t step, const Ids& id, std::span<const Buffer> buffers) {
  Plan p;
  p.manifest.step = step;
  p.manifest.attempt = id.attempt;
  p.manifest.rank = id.rank;
  p.manifest.world_size = id.world;
  p.manifest.writer = "c++";
  std::set<std::string_view> names;
  uint64_t end = 0;
  for (const Buffer& b : buffers) {
    auto bad = [&](const std::string& what) {
      return std::invalid_argument("ddprun::sdk::state::save(step=" + std::to_string(step) + "): tensor '" +
                                   printable(b.name) + "': " + what);
    };
    if (b.name.empty() || b.name.find('\n') != std::string::npos) throw bad("a name is one line, not empty");
    if (!names.insert(b.name).second) throw bad("the name is given twice");
    const auto element = dtype_bytes(b.dtype);
    if (!element)
      throw bad("unknown dtype '" + printable(b.dtype) + "' (torch's names: float32, int64, ...)");
    if (b.device.empty() || b.device.find_first_of(" \n") != std::string::npos) {
      throw bad("device '" + printable(b.device) + "' is not a device name (\"cpu\", \"cuda:0\")");
    }
    uint64_t elements = 1;
    for (const int64_t d : b.shape) {
      if (d < 0) throw bad("a negative dimension");
      elements *= static_cast<uint64_t>(d);
    }
    if (elements * *element != b.nbytes) {
      throw bad(std::to_string(b.nbytes) + " bytes for shape " + shape_text(b.shape) + " of " + b.dtype +
                " (" + std::to_string(elements * *element) + " expected)");
    }
    if (b.nbytes && !b.data) throw bad("no data");
    TensorEntry e;
    e.offset = state_aligned(end);
    e.nbytes = b.nbytes;
    e.dtype = b.dtype;
    e.shape = b.shape;
    e.device = b.device;
    e.name = b.name;
    end = e.offset + e.nbytes;
    p.manifest.tensors.push_back(std::move(e));
  }
  p.manifest.payload = end;
  p.trailer = manifest_trailer(p.manifest);
  return p;
}

StateMemoryError no_room(int64_t step, int rank, uint64_t total, uint64_t kept, uint64_t quota) {
  const long long nproc = env_int("LOCAL_WORLD_SIZE", 1, 1, 1 << 24);
  const uint64_t need_mib = (6 * static_cast<uint64_t>(nproc) * total + (1 << 20) - 1) >> 20;
  return StateMemoryError(
      "ddprun::sdk::state::save(step=" + std::to_string(step) + "): rank " + std::to_string(rank) +
      "'s version takes " + mib(total) + " and the versions it keeps meanwhile " + mib(kept) +
      "; --state_memory gives each of this node's " + std::to_string(nproc) + " local ranks " + mib(quota) +
      " for its own versions (three: two committed, one being written; the buddy's copies "
      "take the rest). Start ddprun with --state_memory " +
      std::to_string(need_mib) + "M or more (6 x " + std::to_string(nproc) + " local ranks x " + mib(total) +
      "; docs/state.md, Memory)");
}

void check_room(const fs::path& dir, int64_t step, int rank, uint64_t total) {
  const uint64_t quota = static_cast<uint64_t>(env_int("DDPRUN_STATE_QUOTA", 0, 0, INT64_MAX));
  if (!quota) return;
  const uint64_t kept = kept_bytes(dir, rank, step);
  if (kept + total > quota) throw no_room(step, rank, total, kept, quota);
}

void pwrite_all(int fd, const void* data, uint64_t n, uint64_t offset, const fs::path& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::pwrite(fd, p, std::min<uint64_t>(n, 1 << 30), static_cast<off_t>(offset));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      const int e = put < 0 ? errno : EIO;
      throw StateError("ddprun::sdk::state::save: cannot write " + path.string() + ": " + errno_text(e) +
                       (e == ENOSPC ? " (the node's --state_memory directory is full)" : ""));
    }
    p += put;
    n -= static_cast<uint64_t>(put);
    offset += static_cast<uint64_t>(put);
  }
}

// Writes .rank<R>.step<S>.<pid>.tmp (`write_payload(fd, path)` the payload, then the trailer) and renames it
// into place: the commit. A failure removes the temporary file.
template <class WritePayload>
void write_version(const fs::path& dir, const Plan& p, WritePayload&& write_payload) {
  const auto& m = p.manifest;
  const fs::path tmp = dir / (".rank" + std::to_string(m.rank) + ".step" + std::to_string(m.step) + "." +
                              std::to_string(::getpid()) + ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw StateError("ddprun::sdk::state::save: cannot create " + tmp.string() + ": " + errno_text(errno));
  }
  try {
    write_payload(fd, tmp);
    pwrite_all(fd, p.trailer.data(), p.trailer.size(), m.payload, tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  const fs::path final_path = dir / version_file_name({m.rank, m.step});
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw StateError("ddprun::sdk::state::save: cannot commit " + final_path.string() + ": " + errno_text(e));
  }
}

// The async save in progress and its staging buffer; what a background write threw waits here for the
// next save(), load() or wait(). Joined at exit (a static's destructor), as Python's atexit wait.
class Saver {
 public:
  ~Saver() {
    try {
      wait();
    } catch (const StateError& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
  }

  void wait() {
    std::exception_ptr error;
    {
      std::lock_guard lock(mu_);
      if (thread_.joinable()) thread_.join();
      std::swap(error, error_);
    }
    if (!error) return;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      throw StateError(std::string("ddprun::sdk::state: the last async save failed: ") + e.what());
    }
  }

  // Copies the buffers into the staging buffer (laid out as the payload) and starts the write.
  void start(const fs::path& dir, Plan p, std::span<const Buffer> buffers) {
    std::lock_guard lock(mu_);
    const uint64_t n = p.manifest.payload;
    if (staging_size_ < n) {
      staging_size_ = n + (n >> 3);
      staging_.reset(new char[staging_size_]);
    }
    uint64_t end = 0;
    for (size_t i = 0; i < buffers.size(); ++i) {
      const TensorEntry& e = p.manifest.tensors[i];
      std::memset(staging_.get() + end, 0, e.offset - end);
      if (e.nbytes) std::memcpy(staging_.get() + e.offset, buffers[i].data, e.nbytes);
      end = e.offset + e.nbytes;
    }
    thread_ = std::thread([this, dir, p = std::move(p)] {
      try {
        prune_versions(dir, p.manifest.rank, 2);  // the two newest stay while this one is written
        write_version(dir, p, [&](int fd, const fs::path& tmp) {
          pwrite_all(fd, staging_.get(), p.manifest.payload, 0, tmp);
        });
      } catch (...) {
        error_ = std::current_exception();  // read after join() only
      }
    });
  }

 private:
  std::mutex mu_;
  std::thread thread_;
  std::exception_ptr error_;
  std::unique_ptr<char[]> staging_;
  uint64_t staging_size_ = 0;
};

Saver& saver() {
  static Saver s;
  return s;
}

std::mutex g_mu;  // guards the two below
std::string g_why;
int g_load_calls = 0;
bool g_warned = false;

void set_why(std::string why) {
  std::lock_guard lock(g_mu);
  g_why = std::move(why);
}

// The manifest of the version open at `fd` (its size in `size`), each tensor's bytes checked against its
// shape (what load() hands out as views must lie inside the file); nullopt with the reason.
std::optional<Manifest> manifest_of(int fd, uint64_t& size, std::string& why) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    why = errno_text(errno);
    return std::nullopt;
  }
  size = static_cast<uint64_t>(st.st_size);
  auto m = read_manifest(fd, size, why);
  for (const TensorEntry& t : m ? m->tensors : std::vector<TensorEntry>{}) {
    uint64_t n = *dtype_bytes(t.dtype);  // parse_manifest accepts known dtypes only
    bool overflow = false;
    for (const int64_t d : t.shape)
      overflow = overflow || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n);
    if (overflow || n != t.nbytes) {
      why = "tensor '" + printable(t.name) + "' has " + std::to_string(t.nbytes) + " bytes for shape " +
            shape_text(t.shape) + " of " + t.dtype;
      return std::nullopt;
    }
  }
  return m;
}

// This rank's committed versions that can be loaded, and why one cannot (the last reason met).
std::map<StepAttempt, fs::path> candidates(const fs::path& dir, const Ids& id, std::string& why) {
  std::map<StepAttempt, fs::path> found;
  for (const StoredVersion& v : list_versions(dir, id.rank)) {
    const int64_t step = v.name.step;
    const fs::path& path = v.file;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // pruned meanwhile
    std::string bad;
    uint64_t size = 0;
    const auto m = manifest_of(fd, size, bad);
    ::close(fd);
    const std::string what = "rank " + std::to_string(id.rank) + "'s version of step " + std::to_string(step);
    if (!m) {
      why = what + " is unreadable: " + bad;
    } else if (m->rank != id.rank || m->step != step) {
      why = what + " holds rank " + std::to_string(m->rank) + "'s step " + std::to_string(m->step);
    } else if (m->world_size != id.world) {
      why = "the state was saved by a job of " + std::to_string(m->world_size) + " ranks and this one has " +
            std::to_string(id.world) + ": ddprun.state does not reshard";
    } else {
      found[{m->step, m->attempt}] = path;
    }
  }
  return found;
}

Version open_version(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw StateError("ddprun::sdk::state::load: cannot open " + path.string() + ": " + errno_text(errno));
  std::string why;
  uint64_t size = 0;
  const auto m = manifest_of(fd, size, why);
  void* addr = MAP_FAILED;
  // Private and writable: what a program writes into a view (torch_state.h's tensors) is its own copy.
  if (m) addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (!m) throw StateError("ddprun::sdk::state::load: " + path.string() + " is unreadable: " + why);
  if (addr == MAP_FAILED) {
    throw StateError("ddprun::sdk::state::load: cannot map " + path.string() + ": " + errno_text(map_errno));
  }
  std::shared_ptr<const void> mapping(addr, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  return VersionAccess::make(*m, std::move(mapping), static_cast<const char*>(addr));
}

}  // namespace

bool enabled() {
  return env("DDPRUN_STATE_DIR") != nullptr;
}

std::string why_none() {
  std::lock_guard lock(g_mu);
  return g_why;
}

void wait() {
  saver().wait();
}

bool save(int64_t step, std::span<const Buffer> buffers, bool async) {
  const char* dir = env("DDPRUN_STATE_DIR");
  if (!dir) {
    std::lock_guard lock(g_mu);
    if (!g_warned) {
      g_warned = true;
      std::fprintf(stderr,
                   "ddprun::sdk::state::save(): this worker runs without ddprun --state_memory; nothing is "
                   "saved\n");
    }
    return false;
  }
  if (step < 0) {
    throw std::invalid_argument("ddprun::sdk::state::save(): step must be 0 or more, not " +
                                std::to_string(step));
  }
  wait();
  const Ids id = ids();
  Plan p = plan(step, id, buffers);
  check_room(dir, step, id.rank, p.total());
  if (async) {
    saver().start(dir, std::move(p), buffers);
    return true;
  }
  write_version(dir, p, [&](int fd, const fs::path& tmp) {
    for (size_t i = 0; i < buffers.size(); ++i) {
      const TensorEntry& e = p.manifest.tensors[i];
      if (e.nbytes) pwrite_all(fd, buffers[i].data, e.nbytes, e.offset, tmp);
    }
  });
  prune_versions(dir, id.rank, 2);
  return true;
}

std::optional<Version> load(Context& ctx, std::chrono::milliseconds timeout) {
  const char* dir = env("DDPRUN_STATE_DIR");
  if (!dir) {
    set_why("this worker runs without ddprun --state_memory");
    return std::nullopt;
  }
  wait();
  const Ids id = ids();
  std::string why;
  const auto found = candidates(dir, id, why);
  if (found.empty() && why.empty()) why = "rank " + std::to_string(id.rank) + " has no version on this node";
  std::vector<StepAttempt> mine;
  for (const auto& [v, path] : found) mine.push_back(v);
  int call = 0;
  {
    std::lock_guard lock(g_mu);
    call = ++g_load_calls;
  }
  Agreement a;
  if (rdzv::Store* store = ctx.store()) {
    try {
      a = agree(*store, call, mine, id.world, why, timeout);
    } catch (const rdzv::StoreError& e) {
      throw StateError(
          "ddprun::sdk::state::load(): the ranks could not agree on a version through the job's "
          "store (every rank must call load(), as often): " +
          std::string(e.what()));
    }
  } else {
    a = agree_alone(mine, why);
  }
  if (!a.agreed) {
    set_why(a.why);
    return std::nullopt;
  }
  for (const StoredVersion& v : list_versions(dir, id.rank)) {
    if (v.name.step > a.agreed->step) ::unlink(v.file.c_str());  // of a timeline the job abandons now
  }
  set_why("");
  return open_version(found.at(*a.agreed));
}

}  // namespace ddprun::sdk::state
