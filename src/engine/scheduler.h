// Continuous batching: which sequences run in the next step and how many of their tokens.
//
// Each step has a token budget and a cap on running sequences. Running sequences go first, in
// admission order: a decode takes one token, a prefill (or the recompute of a preempted sequence)
// a chunk of what it has not computed yet, up to the chunk limit and the budget left, so long
// prompts are split across steps and mixed with decodes. Waiting sequences are then admitted
// in FIFO order while the budget, the cap and the KV blocks allow. When a running sequence needs
// a block and none is free, the preemption policy picks a victim (the newest admitted by default):
// its blocks are returned, and it waits at the front of the queue to be recomputed later.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "engine/sequence.h"

namespace r3::engine {

// Slots and blocks of the sequences the scheduler runs (engine/kv_manager.h).
class KvManager;

struct SchedulerOptions {
  int64_t max_running = 16;      // sequences in one step
  int64_t max_step_tokens = 512;  // tokens in one step
  int64_t max_chunk = 0;          // most tokens of one sequence in one step; 0: the step budget
  int64_t max_waiting = 4096;     // requests' samples waiting for admission

  void validate() const;
};

// Which running sequence gives its blocks back when the pool runs dry.
class PreemptionPolicy {
 public:
  virtual ~PreemptionPolicy() = default;
  virtual Sequence* victim(const std::vector<Sequence*>& running) = 0;
};
// The most recently admitted: the one that has the least work to lose.
class PreemptNewest final : public PreemptionPolicy {
 public:
  Sequence* victim(const std::vector<Sequence*>& running) override;
};

// Which waiting sequence is admitted next.
class AdmissionPolicy {
 public:
  virtual ~AdmissionPolicy() = default;
  // An index into `waiting` (not empty).
  virtual std::size_t next(const std::deque<Sequence*>& waiting) = 0;
};
class AdmitFifo final : public AdmissionPolicy {
 public:
  std::size_t next(const std::deque<Sequence*>& waiting) override;
};

struct ScheduledChunk {
  Sequence* sequence = nullptr;
  int64_t tokens = 0;  // tokens[computed, computed + tokens) run in this step
};

class Scheduler {
 public:
  Scheduler(SchedulerOptions options, KvManager& kv, std::unique_ptr<PreemptionPolicy> preemption = nullptr,
            std::unique_ptr<AdmissionPolicy> admission = nullptr);

  const SchedulerOptions& options() const { return options_; }
  bool can_queue(int64_t count) const {
    return static_cast<int64_t>(waiting_.size()) + count <= options_.max_waiting;
  }
  void enqueue(Sequence* sequence) { waiting_.push_back(sequence); }
  // Takes the sequence out of the queues and gives its slot and blocks back.
  void remove(Sequence* sequence);

  // The next step's chunks; admits and preempts as it goes.
  std::vector<ScheduledChunk> schedule();

  const std::vector<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  int64_t preemptions() const { return preemptions_; }

 private:
  void preempt(Sequence* victim);
  int64_t chunk_for(const Sequence& s, int64_t budget) const;

  SchedulerOptions options_;
  KvManager& kv_;
  std::unique_ptr<PreemptionPolicy> preemption_;
  std::unique_ptr<AdmissionPolicy> admission_;
  std::vector<Sequence*> running_;  // admission order
  std::deque<Sequence*> waiting_;
  int64_t admissions_ = 0;
  int64_t preemptions_ = 0;
};

}  // namespace r3::engine
