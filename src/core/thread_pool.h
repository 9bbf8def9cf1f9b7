// A fixed pool of worker threads for data-parallel CPU kernels.
//
// parallel_for hands out disjoint index ranges; kernels compute every output element on exactly
// one thread with a fixed operation order, so results are bit-identical for any thread count.
// That property is what batch invariance and the parity tests rely on.
//
// A decode step is ~100 short jobs; waking a sleeping thread through the condition variable costs
// about as much as a small job. So workers and the caller first spin briefly (kSpin) on the job
// counter and only then sleep: back-to-back jobs are picked up without a kernel round trip.
#pragma once

#include <atomic>
#include <exception>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "core/function_ref.h"

namespace r3 {

class ThreadPool {
 public:
  // `threads` counts the calling thread; 0 means one per hardware thread.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // The calling thread's index in [0, size()): 0 for the thread that calls parallel_for (and any
  // thread outside a pool), i for worker i. Kernels use it to pick their part of per-thread
  // scratch (backend::Context::per_thread).
  static int thread_index();

  // Calls fn(begin, end) over disjoint ranges covering [0, n), each at least `grain` long
  // (except the last). Runs inline when one range is enough. Exceptions propagate to the caller.
  // `fn` is referenced, not copied: nothing is allocated per job.
  using RangeFn = FunctionRef<void(int64_t begin, int64_t end)>;
  void parallel_for(int64_t n, int64_t grain, RangeFn fn);

 private:
  void stop_and_join();
  void worker_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  // Written under mutex_; also read without it while spinning.
  std::atomic<uint64_t> generation_ = 0;
  std::atomic<bool> stopping_ = false;

  // The job in flight (guarded by mutex_ for publication; chunks claimed atomically).
  const RangeFn* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int64_t next_chunk_ = 0;
  int64_t chunks_total_ = 0;
  std::atomic<int> busy_workers_ = 0;
  std::exception_ptr error_;
};

}  // namespace r3
