// Splitting a wide batch of signals over the cores, for retrax's kernels.
#ifndef RETRAX_NATIVE_PARALLEL_H_
#define RETRAX_NATIVE_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace retrax {

// `body(first, count)` on chunks of kChunk signals of a batch (contiguous in
// the batch-major layout, each a batch of its own), run by the calling
// thread and XLA's intra-op thread pool together: past the cache, a batch
// streams from memory, and the cores share that. Each participant claims
// the next chunk until none is left; the caller returns when every chunk is
// done. A task that starts after the last chunk was claimed finds nothing to
// do (the counters it reads are shared, not the caller's), so the wait never
// depends on a task the pool has not started.
inline constexpr int64_t kChunk = 16;

// Operands and results of more bytes than this stream from memory rather
// than the cache (L2 is a few MiB a core, L3 a few tens shared): the kernels
// then prefetch.
inline constexpr std::size_t kStreamFrom = std::size_t{16} << 20;

template <typename F>
inline void ParallelChunks(xla::ffi::ThreadPool& pool, int64_t batch, const F& body) {
  const int64_t chunks = (batch + kChunk - 1) / kChunk;
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), chunks - 1);
  if (helpers <= 0) {
    body(0, batch);
    return;
  }
  struct Counters {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto counters = std::make_shared<Counters>();
  auto work = [counters, chunks, batch, &body]() {
    for (int64_t c; (c = counters->next.fetch_add(1)) < chunks;) {
      const int64_t first = c * kChunk;
      body(first, std::min(batch - first, kChunk));
      counters->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t i = 0; i < helpers; ++i) {
    auto task = work;  // the pool takes its own copy
    pool.Schedule(std::move(task));
  }
  work();
  while (counters->done.load(std::memory_order_acquire) < chunks) {
    std::this_thread::yield();
  }
}

}  // namespace retrax

#endif  // RETRAX_NATIVE_PARALLEL_H_
