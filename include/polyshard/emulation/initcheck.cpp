// initcheck on the emulated device (initcheck.hpp): the shadow of written bytes, and the callbacks
// of GCC's outline load and store instrumentation that the initcheck library's kernels call.
#include "polyshard/emulation/initcheck.hpp"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "polyshard/emulation/grid.hpp"
#include "polyshard/emulation/runtime.hpp"

namespace polyshard::emulation::initcheck {

#ifdef POLYSHARD_EMULATION_INITCHECK

namespace {

// User space on x86-64 and AArch64 Linux: below 2^47 bytes. One shadow bit per byte, set while the
// byte is tracked and unwritten.
constexpr std::uintptr_t address_space = std::uintptr_t{1} << 47;

// Null until the first allocation reserves the shadow: until then nothing is tracked, and the
// instrumented code that runs before (static initialisers) checks nothing.
std::atomic<std::uint8_t*> shadow_base{nullptr};

std::uint8_t* reserve_shadow() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = ::mmap(nullptr, address_space / 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "polyshard initcheck: cannot reserve %zu bytes of address space for the shadow: %s\n",
                   static_cast<std::size_t>(address_space / 8), std::strerror(errno));
      std::abort();
    }
    shadow_base.store(static_cast<std::uint8_t*>(p), std::memory_order_release);
  });
  return shadow_base.load(std::memory_order_acquire);
}

/// Calls f(shadow byte, mask of the bits [a, a + n) covers in it) for each shadow byte of the range.
template <class F>
void for_each_shadow_byte(std::uint8_t* base, std::uintptr_t a, std::size_t n, F&& f) {
  const std::uintptr_t end = a + n;
  while (a < end) {
    const std::uintptr_t index = a >> 3;
    const unsigned first = static_cast<unsigned>(a & 7);
    const std::uintptr_t left = end - (index << 3);
    const unsigned last = left >= 8 ? 8u : static_cast<unsigned>(left);
    const auto mask = static_cast<std::uint8_t>(((1u << last) - 1u) & ~((1u << first) - 1u));
    f(std::atomic_ref<std::uint8_t>(base[index]), mask);
    a = (index + 1) << 3;
  }
}

bool tracked(std::uintptr_t a, std::size_t n) { return n > 0 && a < address_space && n <= address_space - a; }

void set_bits(std::atomic_ref<std::uint8_t> byte, std::uint8_t mask) { byte.fetch_or(mask, std::memory_order_relaxed); }
/// Reads before it writes: most stores find their bytes written already, and a read leaves the
/// shadow's cache line shared between threads that store beside each other.
void clear_bits(std::atomic_ref<std::uint8_t> byte, std::uint8_t mask) {
  if (byte.load(std::memory_order_relaxed) & mask)
    byte.fetch_and(static_cast<std::uint8_t>(~mask), std::memory_order_relaxed);
}
bool unwritten_at(const std::uint8_t* base, std::uintptr_t address) { return base[address >> 3] >> (address & 7) & 1u; }

/// Sets (`unwritten`) or clears the bits of [p, p + bytes): the whole shadow bytes at once.
void mark(const void* p, std::size_t bytes, bool unwritten) {
  std::uint8_t* base = unwritten ? reserve_shadow() : shadow_base.load(std::memory_order_acquire);
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (base == nullptr || !tracked(a, bytes)) return;
  const auto edge = unwritten ? set_bits : clear_bits;
  const std::uintptr_t end = a + bytes;
  const std::uintptr_t whole_begin = (a + 7) >> 3, whole_end = end >> 3;
  if (whole_end > whole_begin + 1) {
    for_each_shadow_byte(base, a, (whole_begin << 3) - a, edge);
    std::memset(base + whole_begin, unwritten ? 0xFF : 0x00, whole_end - whole_begin);
    for_each_shadow_byte(base, whole_end << 3, end - (whole_end << 3), edge);
    return;
  }
  for_each_shadow_byte(base, a, bytes, edge);
}

[[noreturn]] void report(std::uintptr_t a, std::size_t n) {
  std::size_t first = n, count = 0;
  const std::uint8_t* base = shadow_base.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i)
    if (unwritten_at(base, a + i)) {
      if (first == n) first = i;
      ++count;
    }
  const PointerInfo info = find_pointer(reinterpret_cast<const void*>(a));
  std::string where = running_thread();
  if (where.empty()) where = "host code";
  std::fprintf(stderr,
               "polyshard initcheck: %s read %zu bytes at %p, %zu of them never written: byte %zu of a device "
               "allocation of %zu bytes at %p is the first. On a GPU the read returns whatever the memory held.\n",
               where.c_str(), n, reinterpret_cast<const void*>(a), count,
               static_cast<std::size_t>(a + first - reinterpret_cast<std::uintptr_t>(info.base)), info.size, info.base);
  std::fflush(stderr);
  std::abort();
}

void check_load(std::uintptr_t a, std::size_t n) {
  std::uint8_t* base = shadow_base.load(std::memory_order_relaxed);
  if (base == nullptr || !tracked(a, n)) return;
  bool unwritten = false;
  for_each_shadow_byte(base, a, n, [&](std::atomic_ref<std::uint8_t> byte, std::uint8_t mask) {
    unwritten = unwritten || (byte.load(std::memory_order_relaxed) & mask) != 0;
  });
  if (unwritten) report(a, n);
}

void note_store(std::uintptr_t a, std::size_t n) {
  std::uint8_t* base = shadow_base.load(std::memory_order_relaxed);
  if (base == nullptr || !tracked(a, n)) return;
  for_each_shadow_byte(base, a, n, clear_bits);
}

}  // namespace

bool enabled() { return true; }
void allocated(const void* p, std::size_t bytes) { mark(p, bytes, true); }
void released(const void* p, std::size_t bytes) { mark(p, bytes, false); }
void written(const void* p, std::size_t bytes) { mark(p, bytes, false); }
std::size_t unwritten_bytes(const void* p, std::size_t bytes) {
  const std::uint8_t* base = shadow_base.load(std::memory_order_acquire);
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (base == nullptr || !tracked(a, bytes)) return 0;
  std::size_t count = 0;
  for (std::size_t i = 0; i < bytes; ++i) count += unwritten_at(base, a + i) ? 1 : 0;
  return count;
}

}  // namespace polyshard::emulation::initcheck

// The callbacks GCC calls at every load and store of code compiled with -fsanitize=kernel-address
// and --param=asan-instrumentation-with-call-threshold=0 (the initcheck library's kernels).
extern "C" {
#define POLYSHARD_INITCHECK_ACCESS(size)                                                                              \
  void __asan_load##size##_noabort(std::uintptr_t a) { polyshard::emulation::initcheck::check_load(a, size); }        \
  void __asan_store##size##_noabort(std::uintptr_t a) { polyshard::emulation::initcheck::note_store(a, size); }
POLYSHARD_INITCHECK_ACCESS(1)
POLYSHARD_INITCHECK_ACCESS(2)
POLYSHARD_INITCHECK_ACCESS(4)
POLYSHARD_INITCHECK_ACCESS(8)
POLYSHARD_INITCHECK_ACCESS(16)
#undef POLYSHARD_INITCHECK_ACCESS
void __asan_loadN_noabort(std::uintptr_t a, std::size_t n) { polyshard::emulation::initcheck::check_load(a, n); }
void __asan_storeN_noabort(std::uintptr_t a, std::size_t n) { polyshard::emulation::initcheck::note_store(a, n); }
void __asan_handle_no_return() {}
}

#else  // any other build of the emulation: nothing is tracked

bool enabled() { return false; }
void allocated(const void*, std::size_t) {}
void released(const void*, std::size_t) {}
void written(const void*, std::size_t) {}
std::size_t unwritten_bytes(const void*, std::size_t) { return 0; }

}  // namespace polyshard::emulation::initcheck

#endif
