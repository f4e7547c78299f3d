// OutputPump: reads one stream (stdout or stderr) of a worker from the read end of a pipe, on an
// io_context, and passes it on: every byte, unchanged, to a log file (tee), and whole lines, each with a
// prefix, to a console fd. process_context.h says when a stream goes through a pump.
//
// A line ends at '\n' or at a '\r' (a progress bar that redraws itself, as tqdm does: each redraw with the
// prefix; "\r\n" is one line end). A redraw is shown live: what follows a '\r' is written as soon as it is
// read, not when the next '\r' ends it (tqdm writes "\r" + the bar, then nothing until its next update), and
// the rest of that line follows without a second prefix. Other console lines are atomic: a write() never
// carries part of such a line;
// consecutive whole lines are batched into one write() of at most PIPE_BUF bytes (a longer line gets a
// write() of its own), so lines stay whole even against other processes writing to the same console pipe. A
// line longer than 64 KiB is cut every 64 KiB (each piece ends in '\n' and gets the prefix); a last line
// without '\n' is emitted, with '\n' added, at end of stream.
//
// Ownership and lifetime: owns the pipe and the file (closed at end of file, on a read error, or by
// close()); does not own the console fd. Create with std::make_shared: once start()ed, the pending read
// handler holds the pump until the stream ends or io stops.
// Threads: not thread-safe; construct, call and destroy on io's thread (or while io is not running).
// Blocking: console and file writes are synchronous on io's thread (a full non-blocking fd is waited for
// with poll); reads never block, and one turn of io reads at most 1 MiB before yielding to other handlers.
// Errors: never throws after construction. A failed file write is logged once and the file dropped; console
// write errors are ignored.
//
// Duplicate filters (torch's --duplicate-stdout-filters / --duplicate-stderr-filters): each console line that
// contains one of the filter strings is also appended to a file shared by every worker's pump of the attempt
// (attempt_<n>/filtered_stdout.log), with the filter's own prefix and its line end written as '\n' (torch
// tails the stream in text mode: "\r", "\r\n" and "\n" all end a line as "\n"). Each batch of matching lines
// is one write() to the O_APPEND file, so the lines of several workers never interleave.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/util/unique_fd.h"

namespace ddprun::agent {

// The duplicate filter of one stream of one worker. Inactive when `filters` is empty or `file` is null.
struct DuplicateFilter {
  std::vector<std::string> filters;  // a line that contains any of them is copied; "" matches every line
  std::shared_ptr<UniqueFd> file;    // filtered_<stream>.log of the attempt, shared by the workers' pumps
  std::string prefix;                // torch's "[<role><local_rank>]:" (no node tag)

  bool active() const { return !filters.empty() && file && file->get() >= 0; }
};

// torch's `any(needle in line for needle in filters)`; `line` is one line with its end as '\n' (the last line
// of a stream may have none).
bool line_matches(std::string_view line, const std::vector<std::string>& filters);

class OutputPump : public std::enable_shared_from_this<OutputPump> {
 public:
  // pipe: the read end (made non-blocking here); console_fd: -1 for none; file: -1 for none.
  OutputPump(boost::asio::io_context& io, UniqueFd pipe, int console_fd, std::string prefix, UniqueFd file,
             DuplicateFilter duplicate = {});

  // Starts reading asynchronously on io.
  void start();

  // Consumes exactly the bytes in the pipe now (all a dead worker wrote), then looks for end of file.
  void drain_available();

  // Drains, flushes the partial last line and closes the pipe and the file.
  void close();

  // End of file, a read error or close() was seen: nothing more will be read.
  bool finished() const { return finished_; }

 private:
  void arm();
  void on_readable();
  // One read() of at most `max` bytes. Subtracts what was read from *left. False on EAGAIN, end of file
  // or error (the last two finish the pump).
  bool read_once(size_t max, size_t* left);
  void consume(const char* data, size_t size);
  // Writes the whole lines of pending_ to the console (all of it, '\n' added, when at_eof).
  void emit_lines(bool at_eof);
  void flush(std::string& batch);
  // Adds one whole console line (its own line end included, if any) to `batch` when it matches the duplicate
  // filter.
  void add_duplicate(std::string_view line, std::string& batch) const;
  void flush_duplicates(std::string& batch) const;
  void finish();

  boost::asio::posix::stream_descriptor pipe_;
  const int console_fd_;  // -1: none
  const std::string prefix_;
  UniqueFd file_;           // -1: none
  std::string pending_;     // the start of a line not yet complete
  bool after_cr_ = false;   // the last console line ended with '\r'
  bool mid_line_ = false;   // the start of the current line (a redraw after '\r') is on the console already
  std::string line_shown_;  // that start, for the duplicate filter, which judges whole lines
  const DuplicateFilter duplicate_;
  bool finished_ = false;
};

}  // namespace ddprun::agent
