// ddprun::sdk::init(): the job's Context from the environment ddprun (or torchrun) sets.
#include "ddprun/context.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "ddprun/backends.h"
#include "rendezvous/store/prefix_store.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/util/shm_layout.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::sdk {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

long env_long(const char* name, long fallback, long lo, long hi) {
  const char* v = env(name);
  if (!v) return fallback;
  const auto x = parse_int_in<long>(v, lo, hi);
  if (!x) {
    throw std::runtime_error("ddprun::sdk::init: " + std::string(name) + "='" + v +
                             "' is not an integer in " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  return *x;
}

const char* require(const char* name) {
  const char* v = env(name);
  if (!v) {
    throw std::runtime_error(std::string("ddprun::sdk::init: ") + name +
                             " is not set (RANK and WORLD_SIZE are: run under ddprun or torchrun)");
  }
  return v;
}

class SingleContext final : public Context {
 public:
  SingleContext() : pg_(make_single_process_group()) {}
  ProcessGroup& process_group() override { return *pg_; }
  rdzv::Store* store() override { return nullptr; }

 private:
  std::unique_ptr<ProcessGroup> pg_;
};

class JobContext final : public Context {
 public:
  JobContext(int rank, int world, int local_rank, int local_world, int restarts) {
    rank_ = rank;
    world_size_ = world;
    local_rank_ = local_rank;
    local_world_size_ = local_world;
    restart_count_ = restarts;
  }
  ProcessGroup& process_group() override { return *pg_; }
  rdzv::Store* store() override { return store_.get(); }

  std::unique_ptr<rdzv::StoreServerThread> server_;  // rank 0 without an agent store: the job's store
  std::shared_ptr<rdzv::Store> client_;
  std::shared_ptr<rdzv::PrefixStore> store_;
  std::unique_ptr<ProcessGroup> pg_;  // declared last: destroyed before the store it may use
};

std::shared_ptr<rdzv::Store> connect_store(const std::string& host, uint16_t port,
                                           std::chrono::milliseconds timeout) {
  rdzv::StoreClientOptions so;
  so.connect_timeout = timeout;
  so.timeout = timeout;
  so.dialect = rdzv::Dialect::kModern;  // ddprun's agent store (and torch >= 2.x)
  const std::string where = host + ":" + std::to_string(port);
  try {
    try {
      return std::make_shared<rdzv::StoreClient>(host, port, so);
    } catch (const rdzv::StoreError& e) {
      // A torch 1.13/2.0 TCPStore (torchrun's agent store) does not know VALIDATE: it stays silent
      // (HandshakeTimeoutError after the handshake deadline) or takes it for a SET of absurd length and drops
      // the connection (ConnectionLostError). Either way: speak the legacy dialect on a new connection.
      if (!dynamic_cast<const rdzv::HandshakeTimeoutError*>(&e) &&
          !dynamic_cast<const rdzv::ConnectionLostError*>(&e)) {
        throw;
      }
      so.dialect = rdzv::Dialect::kLegacy;
      return std::make_shared<rdzv::StoreClient>(host, port, so);
    }
  } catch (const rdzv::StoreError& e) {
    throw std::runtime_error("ddprun::sdk::init: cannot use the store at " + where +
                             " (MASTER_ADDR/MASTER_PORT): " + e.what());
  }
}

// torch's env:// rule: with TORCHELASTIC_USE_AGENT_STORE=True (ddprun; torchrun's static rendezvous; torchrun
// >= 2.4 with c10d) MASTER_ADDR:MASTER_PORT is the agent's store; otherwise (torchrun 1.13 with c10d or
// --standalone, torch.distributed.launch, a hand-made environment) rank 0 hosts the job's store there.
bool uses_agent_store() {
  const char* v = env("TORCHELASTIC_USE_AGENT_STORE");
  return v && std::string(v) == "True";
}

std::unique_ptr<rdzv::StoreServerThread> host_store(uint16_t port) {
  rdzv::StoreServerOptions so;
  so.port = port;  // every interface, as torch's TCPStore master binds
  try {
    return std::make_unique<rdzv::StoreServerThread>(so);
  } catch (const rdzv::StoreError& e) {
    throw std::runtime_error(
        "ddprun::sdk::init: rank 0 hosts the job's store (TORCHELASTIC_USE_AGENT_STORE is not "
        "True) but cannot listen on MASTER_PORT=" +
        std::to_string(port) + ": " + e.what());
  }
}

ProcessGroupOptions pg_options_from_env(std::chrono::milliseconds timeout) {
  ProcessGroupOptions o;
  o.timeout = timeout;
  if (const char* t = env("DDPRUN_CPU_TRANSPORT")) {
    std::string v = t;
    if (v == "tcp") {
      o.cpu_transport = CpuTransport::kTcp;
    } else if (v != "auto") {
      throw std::runtime_error("ddprun::sdk::init: DDPRUN_CPU_TRANSPORT='" + v + "' (expected auto or tcp)");
    }
  }
  if (const char* v = env("DDPRUN_SHM_SLOT_BYTES")) {
    const auto slot = shm_slot_bytes(v);
    if (!slot) {
      throw std::runtime_error("ddprun::sdk::init: DDPRUN_SHM_SLOT_BYTES='" + std::string(v) +
                               "' is not an integer in " + std::to_string(kMinShmSlotBytes) + ".." +
                               std::to_string(kMaxShmSlotBytes));
    }
    o.shm_slot_bytes = *slot;
  }
  return o;
}

}  // namespace

std::unique_ptr<Context> init(const InitOptions& options) {
  if (!env("RANK") && !env("WORLD_SIZE")) return std::make_unique<SingleContext>();
  require("RANK");
  require("WORLD_SIZE");
  const int world = static_cast<int>(env_long("WORLD_SIZE", 1, 1, 1 << 24));
  const int rank = static_cast<int>(env_long("RANK", 0, 0, world - 1));
  const int local_rank = static_cast<int>(env_long("LOCAL_RANK", 0, 0, world - 1));
  const int local_world = static_cast<int>(env_long("LOCAL_WORLD_SIZE", 1, 1, world));
  const int restarts = static_cast<int>(env_long("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 30));
  const std::string host = require("MASTER_ADDR");
  require("MASTER_PORT");
  const auto port = static_cast<uint16_t>(env_long("MASTER_PORT", 0, 1, 65535));

  auto ctx = std::make_unique<JobContext>(rank, world, local_rank, local_world, restarts);
  if (!uses_agent_store() && rank == 0) ctx->server_ = host_store(port);
  ctx->client_ = connect_store(host, port, options.timeout);
  ctx->store_ =
      std::make_shared<rdzv::PrefixStore>("ddprun_sdk/attempt_" + std::to_string(restarts), ctx->client_);

  Backend backend = options.backend;
  if (backend == Backend::kAuto) backend = nccl_available() ? Backend::kNccl : Backend::kCpu;
  ProcessGroupOptions pgo = pg_options_from_env(options.timeout);
  if (backend == Backend::kNccl) {
    // NCCL hook: one device per local rank unless named (the NCCL backend validates the device index).
    const int device = options.device >= 0 ? options.device : local_rank;
    ctx->pg_ = make_nccl_process_group(*ctx->store_, "default_pg", rank, world, device, pgo);
  } else {
    ctx->pg_ = make_cpu_process_group(*ctx->store_, "default_pg", rank, world, pgo);
  }
  return ctx;
}

}  // namespace ddprun::sdk
