#include "launcher/slurm/slurm_port.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "launcher/slurm/slurm_env.h"
#include "rendezvous/store/endpoint.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_probe.h"
#include "rendezvous/util/duration_text.h"

namespace ddprun::launcher {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

HostedRendezvous host_on_first_free_port(const std::string& host, const std::vector<uint16_t>& ports,
                                         const std::string& token, const RendezvousFactory& make,
                                         std::shared_ptr<const rdzv::StoreAuth> auth) {
  std::string taken;
  for (uint16_t port : ports) {
    HostedRendezvous hosted;
    try {
      hosted.rendezvous = make(port);
    } catch (const rdzv::BindError& e) {
      spdlog::info("port {} is taken on this host ({}); trying the next candidate", port, e.what());
      taken += (taken.empty() ? "" : ",") + std::to_string(port);
      continue;
    }
    hosted.port = port;
    rdzv::StoreClientOptions o;
    o.connect_timeout = milliseconds(10000);
    o.timeout = milliseconds(10000);
    o.auth = auth;
    rdzv::StoreClient(host, port, o).set(kSlurmStepKey, token);
    spdlog::info("Slurm step {}: the store listens on {}", token, rdzv::format_endpoint(host, port));
    return hosted;
  }
  throw rdzv::BindError("none of the store ports derived from the Slurm job id is free on this host (" +
                        taken + "); give one with --master_port (static) or --rdzv_endpoint (c10d)");
}

uint16_t find_step_store(const std::string& host, const std::vector<uint16_t>& ports,
                         const std::string& token, milliseconds timeout,
                         std::shared_ptr<const rdzv::StoreAuth> auth) {
  const auto deadline = Clock::now() + timeout;
  milliseconds bound(250);                      // per connection attempt in this sweep
  std::vector<std::string> seen(ports.size());  // what each candidate turned out to be, for the final message
  for (int sweep = 0;; ++sweep) {
    for (size_t i = 0; i < ports.size(); ++i) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (left <= milliseconds(0)) {
        std::string detail;
        for (size_t j = 0; j < ports.size(); ++j) {
          detail +=
              (j ? "; " : "") + std::to_string(ports[j]) + ": " + (seen[j].empty() ? "not tried" : seen[j]);
        }
        throw rdzv::TimeoutError(
            "no store of Slurm step " + token + " on " + host + " after " + duration_text(timeout) +
            " (is ddprun running on the first host of the step? see its log). Ports: " + detail);
      }
      const auto o = rdzv::probe_options(std::min(bound, left),
                                         std::min(std::max(bound, milliseconds(2000)), left), auth);
      try {
        rdzv::StoreClient client(host, ports[i], o);
        client.wait({kSlurmStepKey}, o.timeout);  // returns at once when the key is there
        std::string owner = client.get(kSlurmStepKey);
        if (owner == token) {
          spdlog::info("Slurm step {}: found the store on {}", token, rdzv::format_endpoint(host, ports[i]));
          return ports[i];
        }
        if (seen[i] != "store of step " + owner) {
          spdlog::info("port {} on {} belongs to Slurm step {}, not {}; trying the next candidate", ports[i],
                       host, owner, token);
        }
        seen[i] = "store of step " + owner;
      } catch (const rdzv::TimeoutError& e) {
        spdlog::debug("port {} on {}: {}", ports[i], host, e.what());
        // A probe that ran out of time (cut short by the overall deadline, or slow on a busy machine) says
        // nothing new: keep what an earlier one found (a store of another step that answered then).
        if (seen[i].empty()) seen[i] = e.what();
      } catch (const rdzv::StoreError& e) {
        spdlog::debug("port {} on {}: {}", ports[i], host, e.what());
        seen[i] = e.what();
      }
    }
    if (sweep == 0)
      spdlog::info("waiting for the store of Slurm step {} on {} (ports {})", token, host,
                   format_ports(ports));
    bound = std::min(bound * 2, milliseconds(1000));
  }
}

}  // namespace ddprun::launcher
