"""C++ source of the fused CPU kernels' own thread pool (`cpu_fused` puts it first; the kernels split their
loops with `pool::parallel_for`).

An OpenMP team ends each parallel region at a barrier: every thread must arrive. On a host where other
processes hold the cores, a team thread waiting for its slice stalls every operator of a step (a decode
step of 32 sequences on two threads took 1.5 s instead of 70 ms, docs/perf.md). Here the calling thread and
N - 1 sleeping workers take chunks of a loop from an atomic counter, and the loop ends when every chunk is
done, not when every worker has arrived: a worker woken late finds nothing left and sleeps again, and the
caller alone finishes a loop nobody helped with (in a forked child too, whose workers are gone). Waiting
threads spin for a while, then sleep on a condition variable.

How long waiting threads spin before they sleep follows the host's load (`set_quiet`, from the engine's
governor, `engine.cpu_threads`). On a quiet host they spin 50 us: a worker that spins 5 us has often gone to
sleep by a decode step's next loop and must be woken by a system call, which on a virtual machine can take
longer than the loop (a 32-sequence bfloat16 decode step on 2 idle cores: 19.6-21.0 ms spinning 5 us,
16.4-17.8 ms at 20, 50 or 200 us). On a busy host they spin 5 us: a thread spinning on a shared core spends the
slice the other thread's chunk needed (24.8 ms spinning 5 us, 30.9-32.4 ms at 50, with a core burnt).

Each chunk runs the loop body on a contiguous range, as `at::parallel_for` does, and every kernel computes
a row from that row alone, so results do not depend on how a loop is cut.

`set_pool(n)`: n > 0 the pool with n threads; -1 (the default) the pool with torch's thread count of the
calling thread; 0 `at::parallel_for` (OpenMP), also chosen by `MCPMUX_CPU_POOL=0` (see `cpu_fused`).
`set_quiet(q)`: a quiet host or a busy one (the default).
"""

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace pool {

// Chunks per thread: enough that a thread descheduled mid-loop leaves most of its share to the others (one a
// thread made 32-row products up to 12% faster alone, but no decode step faster).
constexpr int64_t kChunksPerThread = 4;
// Whether the host is quiet (set_quiet): how long a waiting thread spins before it sleeps.
std::atomic<bool> quiet{false};

std::chrono::steady_clock::time_point spin_end() {
  const auto spin = std::chrono::microseconds(quiet.load(std::memory_order_relaxed) ? 50 : 5);
  return std::chrono::steady_clock::now() + spin;
}

using Body = void (*)(const void*, int64_t, int64_t);

struct Job {
  const void* ctx;
  Body body;
  int64_t begin, end, chunk, chunks;
  std::atomic<int64_t> next{0}, done{0};
  std::mutex error_mutex;
  std::exception_ptr error;
};

thread_local bool inside = false;  // a pool thread, or a caller inside a loop: nested loops run inline

class Pool {
 public:
  // Runs body over [begin, end) in `threads` threads at most (the caller one of them).
  void run(const std::shared_ptr<Job>& job, int threads) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (static_cast<int>(workers_.size()) < threads - 1) {
        workers_.emplace_back([this] { serve(); });
        workers_.back().detach();
      }
      job_ = job;
      generation_.fetch_add(1, std::memory_order_release);
    }
    for (int i = 0; i < threads - 1; ++i) wake_.notify_one();
    work(*job);
    if (!finished(*job)) {
      const auto until = spin_end();
      while (!finished(*job) && std::chrono::steady_clock::now() < until) {
      }
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [&] { return finished(*job); });
    }
    if (job->error) std::rethrow_exception(job->error);
  }

  std::mutex caller;  // one loop at a time; another caller meanwhile uses at::parallel_for

 private:
  static bool finished(const Job& job) { return job.done.load(std::memory_order_acquire) == job.chunks; }

  void work(Job& job) {
    for (;;) {
      const int64_t c = job.next.fetch_add(1, std::memory_order_relaxed);
      if (c >= job.chunks) return;
      const int64_t b = job.begin + c * job.chunk;
      try {
        job.body(job.ctx, b, std::min(job.end, b + job.chunk));
      } catch (...) {
        std::lock_guard<std::mutex> lock(job.error_mutex);
        if (!job.error) job.error = std::current_exception();
      }
      if (job.done.fetch_add(1, std::memory_order_acq_rel) + 1 == job.chunks) {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.notify_all();
      }
    }
  }

  void serve() {
    inside = true;
    uint64_t seen = generation_.load(std::memory_order_acquire);
    for (;;) {
      const auto until = spin_end();
      while (generation_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < until) {
      }
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
        seen = generation_.load(std::memory_order_relaxed);
        job = job_;
      }
      if (job) work(*job);
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::atomic<uint64_t> generation_{0};
  std::shared_ptr<Job> job_;
  std::vector<std::thread> workers_;
};

Pool& instance() {
  static Pool* pool = new Pool();  // never destroyed: its workers sleep until the process ends
  return *pool;
}

std::atomic<int> mode{-1};

void set_pool(int64_t n) { mode.store(static_cast<int>(n)); }

void set_quiet(bool q) { quiet.store(q, std::memory_order_relaxed); }

// at::parallel_for's contract (f(begin, end) on contiguous ranges of at least grain, inline when small), on
// the pool where it is on.
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  const int m = mode.load(std::memory_order_relaxed);
  if (m == 0) return at::parallel_for(begin, end, grain, f);
  if (begin >= end) return;
  const int64_t n = end - begin;
  const int threads = m > 0 ? m : at::get_num_threads();
  if (inside || threads <= 1 || n <= grain) return f(begin, end);
  std::unique_lock<std::mutex> turn(instance().caller, std::try_to_lock);
  if (!turn.owns_lock()) return at::parallel_for(begin, end, grain, f);
  auto job = std::make_shared<Job>();
  job->ctx = &f;
  job->body = [](const void* ctx, int64_t b, int64_t e) { (*static_cast<const F*>(ctx))(b, e); };
  job->begin = begin;
  job->end = end;
  job->chunk = std::max(grain, (n + threads * kChunksPerThread - 1) / (threads * kChunksPerThread));
  job->chunks = (n + job->chunk - 1) / job->chunk;
  inside = true;
  try {
    instance().run(job, static_cast<int>(std::min<int64_t>(threads, job->chunks)));
  } catch (...) {
    inside = false;
    throw;
  }
  inside = false;
}

}  // namespace pool
"""
