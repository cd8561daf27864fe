// Work shared among the OpenMP threads so that no thread waits for a slower one at an op's end.
//
// at::parallel_for gives each thread one fixed share, so an op lasts as long as its slowest
// thread. On cores the engine shares with others (the server's HTTP thread, a client on the
// same machine, another job), a thread the OS takes off its core for a millisecond then holds
// every other one at the op's end, and a decode step is a few hundred ops. Work of uneven size
// (attention over contexts of different lengths) waits the same way.
//
// parallel_chunks: each thread still owns one contiguous share and works through it from the
// front, a chunk at a time (a weight matrix streams through memory in one run per thread, which
// the hardware prefetchers follow: handing out small chunks from one shared counter instead was
// slower at batch 1, docs/performance.md). A thread done with its own share takes the back half
// of what is left of another's as its new share, until nothing is left (work stealing, as in
// Cilk or TBB).
// Each share is one atomic word, (front, back), changed by compare-and-swap, so its owner and a
// thief never take the same chunk.
//
// Which thread computes a chunk changes no bit: every output element is computed by the same
// code from the same inputs, whoever computes it (the tests compare thread counts).
#pragma once

#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>

namespace servelab {

constexpr int64_t kChunksPerShare = 8;  // a held-up owner keeps at most 1/8 of its share

struct alignas(64) Share {  // [front, back) of one thread's share, on its own cache line
  std::atomic<uint64_t> range{0};
  static uint64_t pack(uint32_t front, uint32_t back) { return uint64_t(back) << 32 | front; }
};

// f(begin, end) over [0, n) in chunks of at least min_chunk; in the caller alone when one thread
// would do or inside another parallel region, as at::parallel_for. An exception from f empties
// every share and is rethrown here, as at::parallel_for rethrows it. n < 2^32.
template <class F>
void parallel_chunks(int64_t n, int64_t min_chunk, const F& f) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(min_chunk, 1);
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), (n + min_chunk - 1) / min_chunk);
  if (threads <= 1 || at::in_parallel_region()) {
    f(int64_t{0}, n);
    return;
  }
  const int64_t chunk = std::max(min_chunk, n / (threads * kChunksPerShare));
  std::unique_ptr<Share[]> shares(new Share[threads]);
  for (int64_t t = 0; t < threads; ++t)  // share t: [n t / threads, n (t + 1) / threads)
    shares[t].range.store(Share::pack(uint32_t(n * t / threads), uint32_t(n * (t + 1) / threads)));
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  auto run = [&](int64_t begin, int64_t end) {
    try {
      f(begin, end);
    } catch (...) {
      if (!failed.exchange(true)) error = std::current_exception();
      for (int64_t t = 0; t < threads; ++t) shares[t].range.store(0);  // nothing left for anyone
    }
  };
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    const int64_t me = omp_get_thread_num();
    std::atomic<uint64_t>& own = shares[me].range;
    for (bool more = true; more;) {
      // its own share, from the front
      for (uint64_t cur = own.load();;) {
        const uint32_t front = uint32_t(cur), back = uint32_t(cur >> 32);
        if (front >= back) break;
        const uint32_t end = uint32_t(std::min<int64_t>(back, front + chunk));
        if (own.compare_exchange_weak(cur, Share::pack(end, back))) {
          run(front, end);
          cur = own.load();
        }
      }
      // then the back half of what another has left becomes its share (so that one can be
      // taken from in turn), until every share is empty (a share whose owner the team lacks,
      // should OpenMP give fewer threads, is taken the same way)
      more = false;
      for (int64_t k = 1; k < threads && !more; ++k) {
        std::atomic<uint64_t>& other = shares[(me + k) % threads].range;
        for (uint64_t cur = other.load();;) {
          const uint32_t front = uint32_t(cur), back = uint32_t(cur >> 32);
          if (front >= back) break;
          const uint32_t take = std::max<uint32_t>(1, (back - front) / 2);
          if (other.compare_exchange_weak(cur, Share::pack(front, back - take))) {
            own.store(Share::pack(back - take, back));  // empty until now: no one else writes it
            more = true;
            break;
          }
        }
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace servelab
