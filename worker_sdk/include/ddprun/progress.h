// Progress heartbeats for ddprun's hang detection and straggler report (docs/hang-detection.md).
//
//   for (...) { train_step(); ddprun::sdk::heartbeat(step_seconds); }
//
// GradientSynchronizer calls it at the end of every synchronised step, with the time since the previous one;
// a program that does not use it calls it itself. Under ddprun with --hang_timeout, each call counts as
// progress of this rank, and the step times let the agent log ranks that are persistently slower than the
// others. Elsewhere ($DDPRUN_PROGRESS_FILE unset) it does nothing.
//
// Cost: one pwrite(2) of a few bytes into the rank's heartbeat file. Thread-safe. Never throws; a file that
// cannot be written is skipped silently (hang detection then sees the rank's CPU time and output only).
#pragma once

namespace ddprun::sdk {

// Records one more step of `step_seconds` (0: unknown) in $DDPRUN_PROGRESS_FILE as "<steps> <seconds>\n".
void heartbeat(double step_seconds = 0);

}  // namespace ddprun::sdk
