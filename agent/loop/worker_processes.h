// WorkerProcesses: the agent's io thread and what runs on it: the workers' ProcessContext
// (agent/process/process_context.h), the signals the agent forwards, the --prestart standbys' timer, and
// torch's FileTimer server (agent/watchdog/file_timer.h). Everything it learns goes to the loop's EventQueue:
// a worker exited, the group was stopped, a signal arrived, a FileTimer deadline was missed.
//
// Threads: construct, call and destroy on the loop's thread; every call that touches the processes is posted
// to the io thread (spawn() waits for it). Blocking: spawn() until every worker has exec'd or one failed; the
// destructor until every worker is reaped (SIGKILL). Internal to the agent loop.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

#include "agent/agent_config.h"
#include "agent/loop/event_queue.h"
#include "agent/process/process_context.h"
#include "agent/watchdog/file_timer.h"
#include "agent/worker_group.h"

namespace ddprun::agent {

class WorkerProcesses {
 public:
  // prestart_stub: the --prestart stub's file (agent/loop/run_directory.h). Nothing runs yet: see start().
  WorkerProcesses(const AgentConfig& config, EventQueue& events, std::filesystem::path prestart_stub);
  // Stops the io thread, then SIGKILLs and reaps every worker and standby and removes the FileTimer FIFO.
  ~WorkerProcesses();
  WorkerProcesses(const WorkerProcesses&) = delete;
  WorkerProcesses& operator=(const WorkerProcesses&) = delete;

  // Serves torch's FileTimer at `fifo`; each missed deadline becomes an Event. Call before start(). Throws
  // std::system_error naming the FIFO.
  void serve_file_timer(const std::filesystem::path& fifo);
  // Catches config.signals_to_handle (each an Event, or see exit_on_signals) and starts the io thread.
  void start();

  // While on (the agent waits in the rendezvous and no worker runs), a signal ends the agent at once with the
  // job's code for it (SupervisionPolicy::exit_code_of_signal), leaving the rendezvous open. Any thread.
  void exit_on_signals(bool on) { exit_on_signals_ = on; }

  // Spawns every worker of `group` and fills in its pid; returns "" or the error that stopped the spawning
  // (the workers started before it are in `group`). With --prestart, then schedules the standbys of the next
  // round, prestart_delay from now (a failure there only costs their speed-up).
  std::string spawn(WorkerGroup& group);
  // --prestart: starts now, for every local rank without one, a standby modelled on `launches` (the workers
  // of a round not known yet), so that the wait in the rendezvous — a spare's above all — imports torch
  // meanwhile. Waits until they are spawned; a failure only costs their speed-up (logged).
  void prestart_missing(const std::vector<WorkerLaunch>& launches);
  // ProcessContext::stop(sig, grace), then an Event kGroupStopped. Returns at once.
  void stop(int sig, std::chrono::milliseconds grace);
  // SIGKILLs every running worker now (a stop is under way). Returns at once.
  void kill();

  // FileTimer requests read so far: a heartbeat of every rank for hang detection (0 without the server).
  uint64_t timer_requests() const { return timer_server_ ? timer_server_->requests() : 0; }

 private:
  void arm_signals();
  void schedule_standbys(const WorkerGroup& group);

  const AgentConfig& config_;
  EventQueue& events_;
  const std::filesystem::path prestart_stub_;
  std::atomic<bool> exit_on_signals_{false};
  boost::asio::io_context io_;
  boost::asio::signal_set signals_{io_};
  boost::asio::steady_timer prestart_timer_{io_};  // when the next standbys start (io's thread)
  std::unique_ptr<FileTimerServer> timer_server_;
  std::unique_ptr<ProcessContext> procs_;
  std::thread io_thread_;
};

}  // namespace ddprun::agent
