// What eqxopt's FFI handlers share: the registry of generated rule functions, the
// thread pool and the task loop over it. `library.cc` includes this once, with
// `elementwise.cc` and `quantized.cc`, so the process holds one library, one
// registry and one pool (`_build.py` copies and hashes every file of this folder).

#pragma once

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <numeric>
#include <string>
#include <pthread.h>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <mutex>
#include <atomic>
#include <thread>
#include <unordered_map>
#include <vector>

#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#define EQXOPT_HAS_MXCSR 1
#endif

namespace ffi = xla::ffi;

using KernelFn = void (*)(const float* const* in, float* const* out,
                          const float* scalars, int64_t n);

namespace {

std::mutex registry_mutex;
std::unordered_map<int64_t, KernelFn>& registry() {
  static auto* kernels = new std::unordered_map<int64_t, KernelFn>();
  return *kernels;
}

KernelFn lookup(int64_t id) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry().find(id);
  return it == registry().end() ? nullptr : it->second;
}

// A handler's answer when `lookup` finds no function (`what`: its kind).
ffi::Error NotLoaded(const char* what) {
  return ffi::Error::Internal(
      std::string("eqxopt: ") + what +
      " kernel not loaded in this process (the step was compiled elsewhere); call "
      "eqxopt.set_native_kernels(False) or retrace");
}

// Below this many elements a leaf runs on the calling thread. Above it, one task
// per `kPerThread` elements, up to the number of cores, shared with a pool of
// threads that live as long as the process (starting a thread per call cost about
// as much as a medium leaf's whole step).
constexpr int64_t kParallelThreshold = 1 << 16;
constexpr int64_t kPerThread = 1 << 15;
constexpr int64_t kAlign = 64;  // elements; keeps each task's range aligned

class Pool {
 public:
  explicit Pool(int n_workers) : size_(n_workers + 1) {
    for (int w = 0; w < n_workers; ++w) std::thread([this] { Work(); }).detach();
  }

  int size() const { return size_; }

  // Runs fn(0), ..., fn(n_tasks - 1) on the caller and the workers; returns when
  // all are done. One job at a time: a caller that finds the pool busy (XLA running
  // two custom calls at once) runs its tasks itself.
  void Run(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (!busy.owns_lock()) {
      for (int64_t t = 0; t < n_tasks; ++t) fn(t);
      return;
    }
    Job job{&fn, n_tasks, {0}};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      ++generation_;
    }
    wake_.notify_all();
    Drain(job);  // every task is claimed when this returns
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = nullptr;  // no worker joins any more; wait for those that did
    finished_.wait(lock, [&] { return active_ == 0; });
  }

 private:
  struct Job {
    const std::function<void(int64_t)>* fn;
    int64_t n_tasks;
    std::atomic<int64_t> next;
  };

  static void Drain(Job& job) {
    for (int64_t t; (t = job.next.fetch_add(1)) < job.n_tasks;) (*job.fn)(t);
  }

  void Work() {
    uint64_t seen = 0;
    for (;;) {
      Job* job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        job = job_;
        if (job == nullptr) continue;
        ++active_;
      }
      Drain(*job);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--active_ == 0) finished_.notify_all();
    }
  }

  const int size_;
  std::mutex run_mutex_, mutex_;
  std::condition_variable wake_, finished_;
  Job* job_ = nullptr;
  int active_ = 0;
  uint64_t generation_ = 0;
};

Pool* pool_instance = nullptr;
std::once_flag pool_once;
// EQXOPT_NUM_THREADS (parsed and checked in Python) caps the threads one call uses,
// like OMP_NUM_THREADS; 0: one per core.
std::atomic<int64_t> thread_cap{0};

Pool& pool() {
  std::call_once(pool_once, [] {
    int cores = std::max(1u, std::thread::hardware_concurrency());
    const int64_t cap = thread_cap.load();
    if (cap > 0) cores = static_cast<int>(std::min<int64_t>(cores, cap));
    pool_instance = new Pool(cores - 1);  // never freed: its threads outlive main
    // A forked child has none of the parent's threads: it runs without a pool.
    pthread_atfork(nullptr, nullptr, [] { pool_instance = new Pool(0); });
  });
  return *pool_instance;
}

// How many tasks a loop over `n` elements in `units` independent pieces gets: one
// below `kParallelThreshold` elements, else one per `kPerThread` elements, at most
// one per thread of the pool and one per piece.
int64_t TaskCount(int64_t n, int64_t units) {
  if (n < kParallelThreshold) return 1;
  const int64_t most = std::min<int64_t>({pool().size(), n / kPerThread, units});
  return std::max<int64_t>(1, most);
}

// Runs fn(0), ..., fn(n_tasks - 1): on the caller alone for one task, else on the
// pool, every task in the caller's floating-point mode (XLA runs its code with
// denormals flushed to zero), so every element rounds the same way on any thread.
template <typename Fn>
void RunTasks(int64_t n_tasks, const Fn& fn) {
  if (n_tasks <= 1) {
    fn(int64_t{0});
    return;
  }
#ifdef EQXOPT_HAS_MXCSR
  const unsigned int mxcsr = _mm_getcsr();
#endif
  pool().Run(n_tasks, [&](int64_t task) {
#ifdef EQXOPT_HAS_MXCSR
    const unsigned int saved = _mm_getcsr();
    _mm_setcsr(mxcsr);
#endif
    fn(task);
#ifdef EQXOPT_HAS_MXCSR
    _mm_setcsr(saved);
#endif
  });
}

// The binding of a step handler: the scalar vector, the leaf buffers, the results,
// then the rule function's id and one count (attributes in name order, as XLA
// passes them; `count` sorts after "kernel").
auto StepBinding(const char* count) {
  return ffi::Ffi::Bind()
      .Arg<ffi::Buffer<ffi::F32>>()
      .RemainingArgs()
      .RemainingRets()
      .Attr<int64_t>("kernel")
      .Attr<int64_t>(count);
}

}  // namespace
