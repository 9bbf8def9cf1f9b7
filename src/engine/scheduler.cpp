#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"
#include "engine/kv_manager.h"

namespace r3::engine {

void SchedulerOptions::validate() const {
  R3_CHECK(max_running >= 1, "max running requests must be >= 1, got ", max_running);
  R3_CHECK(max_step_tokens >= 1, "max tokens per step must be >= 1, got ", max_step_tokens);
  R3_CHECK(max_chunk >= 0, "max prefill chunk must be >= 0, got ", max_chunk);
  R3_CHECK(max_waiting >= 1, "max waiting requests must be >= 1, got ", max_waiting);
}

Sequence* PreemptNewest::victim(const std::vector<Sequence*>& running) {
  return *std::max_element(running.begin(), running.end(),
                           [](const Sequence* a, const Sequence* b) { return a->admitted < b->admitted; });
}

std::size_t AdmitFifo::next(const std::deque<Sequence*>&) { return 0; }

Scheduler::Scheduler(SchedulerOptions options, KvManager& kv, std::unique_ptr<PreemptionPolicy> preemption,
                     std::unique_ptr<AdmissionPolicy> admission)
    : options_(options),
      kv_(kv),
      preemption_(preemption ? std::move(preemption) : std::make_unique<PreemptNewest>()),
      admission_(admission ? std::move(admission) : std::make_unique<AdmitFifo>()) {
  options_.validate();
}

void Scheduler::remove(Sequence* sequence) {
  running_.erase(std::remove(running_.begin(), running_.end(), sequence), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), sequence), waiting_.end());
  kv_.free(*sequence);
}

void Scheduler::preempt(Sequence* victim) {
  kv_.free(*victim);
  victim->computed = 0;
  ++victim->preemptions;
  ++preemptions_;
  running_.erase(std::remove(running_.begin(), running_.end(), victim), running_.end());
  waiting_.push_front(victim);  // first in line to come back
}

int64_t Scheduler::chunk_for(const Sequence& s, int64_t budget) const {
  int64_t n = std::min(s.uncomputed(), budget);
  if (options_.max_chunk > 0) n = std::min(n, options_.max_chunk);
  return n;
}

std::vector<ScheduledChunk> Scheduler::schedule() {
  std::vector<ScheduledChunk> chunks;
  int64_t budget = options_.max_step_tokens;
  for (std::size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* s = running_[i];
    const int64_t n = chunk_for(*s, budget);
    bool preempted_self = false;
    while (!kv_.grow(*s, s->computed + n)) {
      Sequence* victim = preemption_->victim(running_);
      preempt(victim);
      if (victim == s) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) continue;  // running_[i] is now the next sequence
    chunks.push_back({s, n});
    budget -= n;
    ++i;
  }
  while (budget > 0 && static_cast<int64_t>(running_.size()) < options_.max_running && !waiting_.empty()) {
    const std::size_t pick = admission_->next(waiting_);
    Sequence* s = waiting_[pick];
    if (!kv_.admit(*s)) break;
    const int64_t n = chunk_for(*s, budget);
    if (!kv_.grow(*s, s->computed + n)) {
      kv_.free(*s);
      break;
    }
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(pick));
    s->admitted = admissions_++;
    running_.push_back(s);
    chunks.push_back({s, n});
    budget -= n;
  }
  return chunks;
}

}  // namespace r3::engine
