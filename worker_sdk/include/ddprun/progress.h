// Progress heartbeats for ddprun's hang detection and straggler report (docs/hang-detection.md).
//
//   for (...) { train_step(); ddprun::sdk::heartbeat(step_seconds, seconds_before_first_collective); }
//
// GradientSynchronizer calls it at the end of every synchronised step, with the time since the previous one
// and the time from the previous step's end to this step's first all-reduce; a program that does not use it
// calls it itself. Under ddprun each call counts as progress of this rank (hang detection, --max_no_progress_
// restarts), `ddprun status` shows the step, and the agents compare the time before the first collective
// across the job to name stragglers (docs/observability.md#stragglers). Elsewhere ($DDPRUN_PROGRESS_FILE
// unset) it does nothing.
//
// Cost: one pwrite(2) of a few bytes into the rank's heartbeat file. Thread-safe. Never throws; a file that
// cannot be written is skipped silently (hang detection then sees the rank's CPU time and output only).
#pragma once

namespace ddprun::sdk {

// Records one more step in $DDPRUN_PROGRESS_FILE as "<steps> <before_collective_seconds> <step_seconds>\n"
// (a negative time: unknown).
void heartbeat(double step_seconds = -1, double before_collective_seconds = -1);

}  // namespace ddprun::sdk
