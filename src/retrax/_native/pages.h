// Huge pages for the large buffers that retrax's kernels write.
#ifndef RETRAX_NATIVE_PAGES_H_
#define RETRAX_NATIVE_PAGES_H_

#include <cstddef>
#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace retrax {

// XLA's CPU runtime allocates a large output afresh at every call, and the
// first write to each 4 KiB page of it traps into the kernel: at 90 MB
// (512 signals of a second) that costs more than the recursion that fills
// it. Asking for transparent huge pages on the buffer's whole 2 MiB pages
// (as numpy does for its own large arrays) makes that 512 times fewer
// faults. Only a hint: where the system does not use huge pages, or the
// buffer is small, nothing changes, and the values written never do.
inline constexpr std::size_t kHugePage = std::size_t{1} << 21;
inline constexpr std::size_t kAdviseFrom = std::size_t{4} << 20;

inline void AdviseHugePages(void* data, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes < kAdviseFrom) return;
  const auto start = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t first = (start + kHugePage - 1) & ~(kHugePage - 1);
  const std::uintptr_t last = (start + bytes) & ~(kHugePage - 1);
  if (last > first) {
    madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  }
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace retrax

#endif  // RETRAX_NATIVE_PAGES_H_
