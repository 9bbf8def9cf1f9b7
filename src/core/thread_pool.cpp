#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <system_error>

#include "core/check.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace r3 {

namespace {

constexpr auto kSpin = std::chrono::microseconds(50);

thread_local int this_thread_index = 0;  // workers set theirs when they start

// Spins until done() or kSpin has passed; true when done() became true.
template <typename Done>
bool spin_until(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (done()) return true;
#if defined(__x86_64__)
    _mm_pause();
#endif
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) return false;
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  workers_.reserve(static_cast<std::size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) {
    try {
      workers_.emplace_back([this, i] {
        this_thread_index = i;
        worker_loop();
      });
    } catch (const std::system_error& e) {
      // The process may not start that many threads (ulimit -u, address space): stop the ones
      // already running, which wait for work that will never come, and say so.
      stop_and_join();
      R3_FAIL("--threads ", threads, ": could not start thread ", i + 1, " (", e.what(),
              "); the process limits allow fewer threads");
    }
  }
}

void ThreadPool::stop_and_join() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

int ThreadPool::thread_index() { return this_thread_index; }

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::run_chunks() {
  for (;;) {
    int64_t chunk;
    {
      std::lock_guard lock(mutex_);
      if (next_chunk_ >= chunks_total_ || error_) return;
      chunk = next_chunk_++;
    }
    int64_t begin = chunk * job_chunk_;
    int64_t end = std::min(job_n_, begin + job_chunk_);
    try {
      (*job_)(begin, end);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    spin_until([&] { return stopping_ || generation_ != seen; });
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      ++busy_workers_;
    }
    run_chunks();
    {
      std::lock_guard lock(mutex_);
      --busy_workers_;
    }
    work_done_.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, RangeFn fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = (n + grain - 1) / grain;
  if (workers_.empty() || max_chunks <= 1) {
    fn(0, n);
    return;
  }
  // A few chunks per thread balance uneven work without shrinking chunks below `grain`.
  const int64_t chunks = std::min<int64_t>(max_chunks, static_cast<int64_t>(size()) * 4);
  {
    std::lock_guard lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = (n + chunks - 1) / chunks;
    chunks_total_ = (n + job_chunk_ - 1) / job_chunk_;
    next_chunk_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  work_ready_.notify_all();
  run_chunks();
  spin_until([&] { return busy_workers_ == 0; });
  std::exception_ptr error;
  {
    std::unique_lock lock(mutex_);
    // Every chunk is claimed once next_chunk_ reaches the total; wait for the running ones.
    work_done_.wait(lock, [&] { return busy_workers_ == 0; });
    // After an error some chunks were never claimed: retire them, so a worker that wakes only
    // now finds nothing to run instead of calling a job that has already returned.
    next_chunk_ = chunks_total_;
    job_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace r3
