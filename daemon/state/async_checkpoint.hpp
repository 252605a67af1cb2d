// A checkpoint being written in the background: its snapshot handed to one writer thread that
// pickles, writes and fsyncs this rank's shard files (write_share) while training goes on; then,
// on rank 0, once the trainer thread saw every rank's write done and the ranks agreed on it
// (RunState), the publish's file work (publish_files: manifest, rename, syncs, pruning). The
// thread never touches the control plane. At most one exists at a time.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "daemon/state/checkpoint.hpp"

namespace thetad::daemon {

class CheckpointInFlight {
 public:
  // Starts the writer thread on `share` (snapshot_share's, already agreed by every rank), which
  // writes with w.threads threads (background_checkpoint_threads). `stall_ms`: what the trainer
  // spent on it so far (the snapshot), for the log.
  CheckpointInFlight(CheckpointWriter w, std::unique_ptr<CheckpointShare> share, double stall_ms);
  // Cancels the write (it stops before its next file) and waits for the thread up to
  // `abandon_wait` (then leaves it: the process is on its way out). Never starts a publish: an
  // unpublished write's temporary directory stays unpublished (the next checkpoint's prune
  // removes it); a publish already under way (agreed by every rank) completes.
  ~CheckpointInFlight();
  CheckpointInFlight(const CheckpointInFlight&) = delete;
  CheckpointInFlight& operator=(const CheckpointInFlight&) = delete;

  // After done() and the agreement on the write: runs publish_files on the thread (rank 0).
  void publish_in_background();
  bool publishing = false;  // the write was agreed on; the publish (rank 0) is under way or done

  bool done() const;
  // Waits for the writer up to `timeout`; true once it is done.
  bool wait(std::chrono::milliseconds timeout) const;
  // After done(): this rank's outcome and the thread's time (write, then publish).
  const WriteStatus& status() const { return shared_->status; }
  double write_ms() const { return shared_->write_ms; }
  // After done(): the snapshot's buffers, for the next checkpoint to reuse.
  std::unique_ptr<CheckpointShare> take_share() { return std::move(shared_->share); }
  const CheckpointWriter& writer() const { return shared_->writer; }
  double stall_ms = 0;     // the trainer's time on this checkpoint: snapshot, polls, waits
  double snapshot_ms = 0;  // of which at the checkpointing step
  std::chrono::milliseconds abandon_wait{10000};

 private:
  // Owned jointly with the thread, which may outlive this object (abandoned at exit).
  struct Shared {
    CheckpointWriter writer;
    std::unique_ptr<CheckpointShare> share;
    WriteStatus status;
    double write_ms = 0;
    std::atomic<bool> cancel{false};
    mutable std::mutex mu;
    mutable std::condition_variable cv;
    bool done = false;
  };
  void start(std::function<void(Shared&)> task);
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
};

}  // namespace thetad::daemon
