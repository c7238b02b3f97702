// The emulated device's execution model: runs a kernel's grid on the calling OS thread, block
// after block, each thread of a block a Boost.Context fiber resumed round-robin by a scheduler,
// so that barriers and warp intrinsics are real meeting points (see grid.hpp).
//
// Every build uses Boost's fast fcontext fibers; under AddressSanitizer and ThreadSanitizer this
// file tells the sanitizer about every switch itself. (Boost's ucontext fibers annotate for ASan on
// their own, but ASan's swapcontext interceptor clears the shadow of the whole destination stack,
// which made each switch about a hundred times dearer.)
#if defined(__SANITIZE_ADDRESS__)
#define POLYSHARD_EMULATION_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define POLYSHARD_EMULATION_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define POLYSHARD_EMULATION_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define POLYSHARD_EMULATION_TSAN 1
#endif
#endif

#if defined(POLYSHARD_EMULATION_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(POLYSHARD_EMULATION_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <boost/context/fiber.hpp>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "polyshard/emulation/grid.hpp"
#include "polyshard/emulation/runtime.hpp"

namespace ctx = boost::context;

namespace polyshard::emulation {
namespace {

constexpr unsigned max_block_threads = 1024;
constexpr unsigned warp_size = 32;

// Kernel stack frames are small (a few arrays of V <= 16 elements), but exception unwinding and
// message formatting on a fault need a few KiB, and ASan's redzones and fake frames several
// times more.
#if defined(POLYSHARD_EMULATION_ASAN) || defined(POLYSHARD_EMULATION_TSAN)
constexpr std::size_t stack_bytes = 256 * 1024;
#else
constexpr std::size_t stack_bytes = 64 * 1024;
#endif

// ---- ThreadSanitizer: one fiber for all the threads of a grid ----------------------------------------
//
// TSan is told of one fiber per OS thread's pool, entered when a grid starts and left when it
// ends, not of a fiber per emulated thread. What the TSan stage watches is a grid's memory
// accesses against other OS threads (other streams' grids and copies, the host): the grid fiber
// carries them, ordered after what its stream's thread did before the launch and before what it
// does after. Between the threads of one block TSan has nothing to find: the scheduler runs them
// one at a time, each switch ordered before the next. Told apart, they cost it dearly: each TSan
// fiber is a thread in its vector clocks, and with one per worker (up to 1024 per OS thread)
// every switch was a clock operation over thousands of entries, which made ThreadSanitizer's
// engine runs take a minute each instead of seconds. The one cost: the block's threads share the
// fiber's shadow call stack, so the stack of a race inside a kernel can show frames of other
// threads of its block below its own.

#if defined(POLYSHARD_EMULATION_TSAN)
void* tsan_current() { return __tsan_get_current_fiber(); }
void* tsan_create() { return __tsan_create_fiber(0); }
void tsan_destroy(void* f) { __tsan_destroy_fiber(f); }
// Flags 0: the switch orders what ran before it before what runs after.
void tsan_switch(void* f) { __tsan_switch_to_fiber(f, 0); }
#else
void* tsan_current() { return nullptr; }
void* tsan_create() { return nullptr; }
void tsan_destroy(void*) {}
void tsan_switch(void*) {}
#endif

// ---- fiber stacks ---------------------------------------------------------------------------------

/// One fiber's stack: mapped with an inaccessible page below it, so an overflow faults at once
/// instead of overwriting the neighbouring stack.
class Stack {
 public:
  Stack() {
    guard_ = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    void* p = ::mmap(nullptr, guard_ + stack_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base_ = static_cast<char*>(p);
    ::mprotect(base_, guard_, PROT_NONE);
#if defined(POLYSHARD_EMULATION_ASAN)
    // ASan does not clear the shadow of unmapped pages: these may come back with the poison of an
    // earlier mapping whose owner left some (a stack whose frames were never popped). The fiber
    // must start on clean shadow.
    ASAN_UNPOISON_MEMORY_REGION(bottom(), stack_bytes);
#endif
  }
  ~Stack() {
#if defined(POLYSHARD_EMULATION_ASAN)
    // Frames abandoned by an exception may leave poisoned shadow behind; the pages can come back
    // from a later mmap as ordinary memory.
    ASAN_UNPOISON_MEMORY_REGION(base_ + guard_, stack_bytes);
#endif
    ::munmap(base_, guard_ + stack_bytes);
  }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;

  ctx::stack_context context() const {
    ctx::stack_context s;
    s.size = stack_bytes;
    s.sp = bottom() + stack_bytes;  // stacks grow down: sp is the top
    return s;
  }
  /// The lowest usable byte, above the guard page.
  char* bottom() const { return base_ + guard_; }

 private:
  char* base_ = nullptr;
  std::size_t guard_ = 0;
};

/// Boost's StackAllocator over a Stack that its Worker owns: the fiber neither allocates nor frees.
struct BorrowedStack {
  ctx::stack_context stack;
  ctx::stack_context allocate() const { return stack; }
  void deallocate(ctx::stack_context&) const noexcept {}
};

// ---- the threads of a block --------------------------------------------------------------------

/// Where a thread of the running block stands.
enum class Wait : unsigned char {
  ready,    // to be resumed in the scheduler's next pass
  barrier,  // at __syncthreads()
  warp,     // at a warp intrinsic
  exited,   // returned from the kernel (every worker between blocks)
};

enum class WarpOp : unsigned char { sync, exchange, ballot };

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::sync:
      return "__syncwarp()";
    case WarpOp::exchange:
      return "a __shfl*_sync()";
    case WarpOp::ballot:
      return "a __ballot_sync() / __any_sync() / __all_sync()";
  }
  return "a warp intrinsic";
}

/// Thrown inside a fiber to unwind a thread of a block that is being abandoned after a fault.
struct Abandon {};

/// One fiber, reused for thread after thread: it runs the kernel body for whichever thread the
/// scheduler gives it, then parks until the next.
struct Worker {
  // The thread it runs in the current block.
  uint3 tid{};
  unsigned linear = 0;
  Wait wait = Wait::exited;
  WarpOp op = WarpOp::sync;
  bool in_body = false;  // suspended inside the kernel body (not parked between threads)
  bool abandon = false;  // resumed only to unwind
  bool shutdown = false;
  unsigned mask = 0;
  int source = 0;
  std::uint64_t value = 0, result = 0;
  // cp.async copies this thread started: committed groups, oldest first, and those not yet
  // committed.
  struct AsyncCopy {
    void* dst;
    const void* src;
    std::size_t bytes;
  };
  std::deque<std::vector<AsyncCopy>> copy_groups;
  std::vector<AsyncCopy> uncommitted_copies;

  Stack stack;
  ctx::fiber fiber;      // this worker, while it is suspended
  ctx::fiber scheduler;  // the scheduler, while this worker runs
#if defined(POLYSHARD_EMULATION_ASAN)
  void* asan_fake_stack = nullptr;  // this worker's fake stack, while it is suspended
#endif
};

/// What the fibers of the running grid share.
struct Run {
  std::string_view kernel;
  const LaunchShape* shape = nullptr;
  const std::function<void()>* body = nullptr;
  uint3 block{};
  unsigned threads = 0;  // per block
  void* shared = nullptr;
  unsigned exited = 0, at_barrier = 0, at_warp = 0;  // threads of the current block in each state
  std::optional<DeviceFault> fault;  // the first fault of the current block
};

thread_local Worker* current_worker = nullptr;  // the fiber running now, null in the scheduler
thread_local Run* current_run = nullptr;
// Counts the blocks this OS thread has started: a static __shared__ object (POLYSHARD_SHARED) is
// poisoned the first time a thread of a block reaches its declaration, once per block.
thread_local std::uint64_t block_serial = 0;
thread_local std::unordered_map<void*, std::uint64_t> shared_poisoned_in;

// ---- AddressSanitizer: tell it which stack is in use ----------------------------------------------
//
// ASan keeps, per OS thread, the bounds of the stack in use (to unpoison the frames an exception
// abandons, and to describe a stack address in a report) and a fake stack (the frames that
// detect_stack_use_after_return moves off the real stack). Each switch is begun on the side that
// leaves, naming the stack it goes to and where to keep its own fake stack, and finished on the
// side that arrives, which takes its fake stack back and learns the stack it came from.

#if defined(POLYSHARD_EMULATION_ASAN)
// The scheduler's side: the OS thread's own stack, as the fibers were told it at their last switch.
thread_local const void* asan_scheduler_bottom = nullptr;
thread_local std::size_t asan_scheduler_size = 0;
thread_local void* asan_scheduler_fake_stack = nullptr;

/// The scheduler is about to resume `w`.
void asan_to_fiber(const Worker& w) {
  __sanitizer_start_switch_fiber(&asan_scheduler_fake_stack, w.stack.bottom(), stack_bytes);
}
/// The scheduler runs again.
void asan_in_scheduler() { __sanitizer_finish_switch_fiber(asan_scheduler_fake_stack, nullptr, nullptr); }
/// `w` is about to suspend itself.
void asan_to_scheduler(Worker& w) {
  __sanitizer_start_switch_fiber(&w.asan_fake_stack, asan_scheduler_bottom, asan_scheduler_size);
}
/// `w` runs again, or for the first time (its fake stack is then null: ASan makes one when needed).
void asan_in_fiber(const Worker& w) {
  __sanitizer_finish_switch_fiber(w.asan_fake_stack, &asan_scheduler_bottom, &asan_scheduler_size);
}
/// `w` leaves for good: a null save tells ASan to free its fake stack. Nothing after this in the
/// fiber may need a fake frame (none can get one while a switch is under way).
void asan_fiber_ends() { __sanitizer_start_switch_fiber(nullptr, asan_scheduler_bottom, asan_scheduler_size); }
/// Back from making `w`'s fiber. Boost's fcontext constructor enters the new stack and its entry
/// function, which jumps straight back; that function's frame, which holds the fiber's own state
/// until it ends, must be on the fiber's stack. Announced by asan_to_fiber(), the entry had no
/// fake stack and put it there (else it would lie in the scheduler's fake stack, which reuses it
/// once the scheduler's frames have moved past). Nothing on the fiber's side can finish that
/// switch, so finish it here, where ASan takes the fiber's stack for ours, and switch back to ours.
void asan_made_fiber() {
  const void* bottom = nullptr;
  std::size_t size = 0;
  __sanitizer_finish_switch_fiber(asan_scheduler_fake_stack, &bottom, &size);
  __sanitizer_start_switch_fiber(&asan_scheduler_fake_stack, bottom, size);
  __sanitizer_finish_switch_fiber(asan_scheduler_fake_stack, nullptr, nullptr);
}
#else
void asan_to_fiber(const Worker&) {}
void asan_in_scheduler() {}
void asan_to_scheduler(Worker&) {}
void asan_in_fiber(const Worker&) {}
void asan_fiber_ends() {}
void asan_made_fiber() {}
#endif

std::string dims(const uint3& v) {
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) about "(" + std::to_string(...).
  std::string s = "(";
  s += std::to_string(v.x);
  s += ',';
  s += std::to_string(v.y);
  s += ',';
  s += std::to_string(v.z);
  s += ')';
  return s;
}
std::string spaced(const char* what, const dim3& v) {
  return std::string(what) + " (" + std::to_string(v.x) + ", " + std::to_string(v.y) + ", " + std::to_string(v.z) + ")";
}
std::string hex(unsigned m) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", m);
  return buf;
}
/// "lane 5", "lanes 3, 7, 16-31".
std::string lane_list(unsigned bits) {
  std::string s;
  int count = 0;
  for (int l = 0; l < 32;) {
    if (!(bits >> l & 1u)) {
      ++l;
      continue;
    }
    int e = l;
    while (e + 1 < 32 && (bits >> (e + 1) & 1u)) ++e;
    if (!s.empty()) s += ", ";
    s += e == l ? std::to_string(l) : std::to_string(l) + "-" + std::to_string(e);
    count += e - l + 1;
    l = e + 1;
  }
  return (count == 1 ? "lane " : "lanes ") + s;
}

std::string kernel_prefix(const Run& run) { return "kernel " + std::string(run.kernel) + ": "; }

Worker& self(const char* what) {
  if (current_worker == nullptr)
    throw std::logic_error(std::string(what) + " used outside a kernel: only a running grid's threads have it");
  return *current_worker;
}

/// Back to the scheduler until it resumes this thread.
void suspend(Worker& w) {
  asan_to_scheduler(w);
  w.scheduler = std::move(w.scheduler).resume();
  asan_in_fiber(w);
}

/// Records the first fault of the block; the scheduler abandons the block when the fiber parks.
void record_fault(Run& run, Worker& w, cudaError_t code, const std::string& what) noexcept {
  if (run.fault) return;
  try {
    run.fault =
        DeviceFault{code, kernel_prefix(run) + "thread " + dims(w.tid) + " of block " + dims(run.block) + " " + what};
  } catch (...) {
    run.fault = DeviceFault{code, {}};  // out of memory for the message: the code still tells
  }
}

/// One thread's run of the kernel body; nothing but Boost's own unwinding escapes the fiber.
void run_thread(Worker& w) {
  Run& run = *current_run;
  w.in_body = true;
  w.copy_groups.clear();
  w.uncommitted_copies.clear();
  try {
    (*run.body)();
    // A thread that ends with copies in flight still has them land, as on a GPU. (Checked first:
    // most kernels copy nothing, and an empty group would still cost an allocation a thread.)
    if (!w.uncommitted_copies.empty()) async_copy_commit();
    if (!w.copy_groups.empty()) async_copy_wait(0);
  } catch (const ctx::detail::forced_unwind&) {
    // Boost unwinding a fiber it destroys: the pool never destroys one inside the body, but if it
    // did, swallowing this would resume a dead context.
    throw;
  } catch (const Abandon&) {
    // The block was abandoned after another thread's fault.
  } catch (const DeviceFault& f) {
    record_fault(run, w, f.code, "faulted: " + f.message);
  } catch (const std::exception& e) {
    // Device code has no exceptions: a throw is an assertion failing in the emulated kernel.
    record_fault(run, w, cudaErrorAssert, std::string("threw: ") + e.what());
  } catch (...) {
    record_fault(run, w, cudaErrorAssert, "threw an exception that is not a std::exception");
  }
  w.in_body = false;
  w.wait = Wait::exited;
  ++run.exited;
}

// ---- the pool of fibers ----------------------------------------------------------------------------

/// This OS thread's fibers, kept from block to block and launch to launch. A grid runs on one OS
/// thread, so nothing here is shared between threads.
class Pool {
 public:
  Pool() {}
  ~Pool() {
    // Under TSan, workers exist only once a grid has run here, which made the grid fiber.
    void* me = tsan_current();
    if (tsan_grid_ != nullptr) tsan_switch(tsan_grid_);
    for (auto& w : workers_) {
      if (!w->fiber) continue;
      // Parked between threads (every block ends that way): let its loop return.
      w->shutdown = true;
      current_worker = w.get();
      asan_to_fiber(*w);
      w->fiber = std::move(w->fiber).resume();
      asan_in_scheduler();
      current_worker = nullptr;
    }
    if (tsan_grid_ != nullptr) {
      tsan_switch(me);
      tsan_destroy(tsan_grid_);
    }
  }

  /// ThreadSanitizer's fiber for this thread's grids (null without TSan).
  void* tsan_grid() {
    if (tsan_grid_ == nullptr) tsan_grid_ = tsan_create();
    return tsan_grid_;
  }

  /// At least n workers, each parked before its first thread.
  void reserve(unsigned n) {
    while (workers_.size() < n) {
      auto w = std::make_unique<Worker>();
      Worker* raw = w.get();
      // Making the fiber enters it briefly: let ASan see that as the new fiber.
      asan_to_fiber(*raw);
      raw->fiber = ctx::fiber(std::allocator_arg, BorrowedStack{raw->stack.context()}, [raw](ctx::fiber&& scheduler) {
        asan_in_fiber(*raw);
        raw->scheduler = std::move(scheduler);
        while (!raw->shutdown) {
          run_thread(*raw);
          suspend(*raw);
        }
        asan_fiber_ends();
        return std::move(raw->scheduler);
      });
      asan_made_fiber();
      workers_.push_back(std::move(w));
      order_.push_back(raw);
    }
  }

  Worker* const* workers() const { return order_.data(); }
  std::size_t size() const { return workers_.size(); }

  /// The dynamic shared memory of a block: `bytes` long, 128-byte aligned (a GPU gives at least 16).
  void* shared(std::size_t bytes) {
    if (bytes > shared_capacity_) {
      shared_.reset(static_cast<std::byte*>(::operator new (bytes, std::align_val_t{128})));
      shared_capacity_ = bytes;
    }
    return shared_.get();
  }

  bool running = false;
  std::vector<Worker*> ready, next;  // the scheduler's passes

 private:
  struct AlignedDelete {
    void operator()(std::byte* p) const { ::operator delete (p, std::align_val_t{128}); }
  };
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<Worker*> order_;
  std::unique_ptr<std::byte, AlignedDelete> shared_;
  std::size_t shared_capacity_ = 0;
  void* tsan_grid_ = nullptr;
};

Pool& pool() {
  thread_local Pool p;
  return p;
}

void resume(Worker& w) {
  current_worker = &w;
  asan_to_fiber(w);
  w.fiber = std::move(w.fiber).resume();
  asan_in_scheduler();
  current_worker = nullptr;
}

// ---- the scheduler ---------------------------------------------------------------------------------

class BlockScheduler {
 public:
  BlockScheduler(Pool& pool, Run& run) : pool_(pool), run_(run), w_(pool.workers()), n_(run.threads) {}

  /// Runs the block to its end; throws DeviceFault.
  void run() {
    start();
    try {
      for (;;) {
        for (Worker* w : pool_.ready) {
          resume(*w);
          if (run_.fault) throw_fault();
        }
        if (run_.exited == n_) return;
        pool_.next.clear();
        release();
        if (run_.fault) throw_fault();
        std::swap(pool_.ready, pool_.next);
      }
    } catch (...) {
      abandon();
      throw;
    }
  }

 private:
  void start() {
    const dim3& b = run_.shape->block;
    pool_.ready.clear();
    for (unsigned i = 0; i < n_; ++i) {
      Worker& w = *w_[i];
      w.linear = i;
      w.tid = uint3{i % b.x, i / b.x % b.y, i / (b.x * b.y)};
      w.wait = Wait::ready;
      w.abandon = false;
      pool_.ready.push_back(&w);
    }
    run_.exited = run_.at_barrier = run_.at_warp = 0;
    run_.fault.reset();
    ++block_serial;
    if (run_.shape->dynamic_shared_bytes > 0)
      std::memset(run_.shared, 0xFF, run_.shape->dynamic_shared_bytes);  // NaN in every float type
  }

  [[noreturn]] void throw_fault() {
    DeviceFault f = std::move(*run_.fault);
    run_.fault.reset();
    throw f;
  }

  void fault(std::string what) {
    if (!run_.fault) run_.fault = DeviceFault{cudaErrorLaunchFailure, kernel_prefix(run_) + std::move(what)};
  }

  /// Unwinds every thread still inside the body, so each fiber parks cleanly for the next block.
  void abandon() noexcept {
    for (unsigned i = 0; i < n_; ++i) {
      Worker& w = *w_[i];
      if (!w.in_body) continue;
      w.abandon = true;
      resume(w);
    }
  }

  std::string thread_name(unsigned linear) const { return "thread " + dims(w_[linear]->tid); }

  /// After a pass every thread waits or has exited: releases the warp groups that are complete,
  /// else the barrier, else reports why the block cannot go on.
  void release() {
    if (run_.at_warp > 0) release_warps();
    if (run_.fault || !pool_.next.empty()) return;
    const auto where = [&] {
      return "__syncthreads() in block " + dims(run_.block) + " reached by " + std::to_string(run_.at_barrier) +
             " of " + std::to_string(n_) + " threads; ";
    };
    if (run_.at_barrier > 0 && run_.exited > 0) {
      unsigned gone = 0;
      while (w_[gone]->wait != Wait::exited) ++gone;
      fault(where() + thread_name(gone) + " returned without reaching it");
    } else if (run_.at_barrier > 0 && run_.at_warp == 0) {
      for (unsigned i = 0; i < n_; ++i) {
        w_[i]->wait = Wait::ready;
        pool_.next.push_back(w_[i]);
      }
      run_.at_barrier = 0;
    } else if (run_.at_warp == 0) {
      fault("block " + dims(run_.block) + ": the scheduler lost track of its threads (an emulator bug)");
    } else {
      // Threads at warp intrinsics wait for lanes that wait at the barrier.
      unsigned waiter = 0;
      while (w_[waiter]->wait != Wait::warp) ++waiter;
      const Worker& w = *w_[waiter];
      const unsigned base = waiter / warp_size * warp_size;
      unsigned blocked = 0;
      for (unsigned l = 0; l < warp_size && base + l < n_; ++l)
        if ((w.mask >> l & 1u) && w_[base + l]->wait == Wait::barrier) blocked |= 1u << l;
      fault(where() + thread_name(waiter) + " waits at " + op_name(w.op) + " (warp " +
            std::to_string(base / warp_size) + ", mask " + hex(w.mask) + ") for " + lane_list(blocked) +
            (std::has_single_bit(blocked) ? ", which waits" : ", which wait") + " at the barrier");
    }
  }

  void release_warps() {
    for (unsigned base = 0; base < n_; base += warp_size) {
      const unsigned lanes = std::min(warp_size, n_ - base);
      const unsigned present = lanes == 32 ? ~0u : (1u << lanes) - 1u;
      for (unsigned l = 0; l < lanes; ++l) {
        const Worker& a = *w_[base + l];
        if (a.wait != Wait::warp) continue;
        const unsigned m = a.mask;
        const auto where = [&] {
          return op_name(a.op) + std::string(" with mask ") + hex(m) + " in block " + dims(run_.block) + ", warp " +
                 std::to_string(base / warp_size) + ": ";
        };
        if (!(m >> l & 1u)) {
          fault(where() + "the mask does not name the calling lane " + std::to_string(l) + " (" +
                thread_name(base + l) + ")");
          return;
        }
        if (m & ~present) {
          fault(where() + lane_list(m & ~present) + " do not exist (the block has " + std::to_string(n_) + " threads)");
          return;
        }
        unsigned exited = 0, blocked = 0, differ = 0;
        for (unsigned j = 0; j < lanes; ++j) {
          if (!(m >> j & 1u)) continue;
          const Worker& b = *w_[base + j];
          if (b.wait == Wait::exited)
            exited |= 1u << j;
          else if (b.wait != Wait::warp)
            blocked |= 1u << j;
          else if (b.mask != m || b.op != a.op)
            differ |= 1u << j;
        }
        if (exited) {
          fault(where() + lane_list(exited) + " returned without reaching it");
          return;
        }
        if (differ) {
          const int j = std::countr_zero(differ);
          const Worker& b = *w_[base + j];
          fault(where() + "lane " + std::to_string(j) + " (" + thread_name(base + j) + ") waits at " + op_name(b.op) +
                " with mask " + hex(b.mask) + " instead");
          return;
        }
        if (blocked) continue;  // a lane waits at the barrier: the block may be stuck (release() decides)
        meet(base, m, a.op);
      }
    }
  }

  /// The lanes `m` of the warp at `base` all wait at the same intrinsic: gives each its result.
  void meet(unsigned base, unsigned m, WarpOp op) {
    Worker* const* lane = w_ + base;
    if (op == WarpOp::exchange) {
      for (unsigned bits = m; bits != 0; bits &= bits - 1) {
        Worker& b = *lane[std::countr_zero(bits)];
        const int s = b.source;
        b.result = s >= 0 && s < 32 && (m >> s & 1u) ? lane[s]->value : b.value;
      }
    } else if (op == WarpOp::ballot) {
      std::uint64_t votes = 0;
      for (unsigned bits = m; bits != 0; bits &= bits - 1) {
        const int j = std::countr_zero(bits);
        if (lane[j]->value != 0) votes |= 1u << j;
      }
      for (unsigned bits = m; bits != 0; bits &= bits - 1) lane[std::countr_zero(bits)]->result = votes;
    }
    for (unsigned bits = m; bits != 0; bits &= bits - 1) {
      Worker& b = *lane[std::countr_zero(bits)];
      b.wait = Wait::ready;
      pool_.next.push_back(&b);
    }
    run_.at_warp -= static_cast<unsigned>(std::popcount(m));
  }

  Pool& pool_;
  Run& run_;
  Worker* const* w_;
  unsigned n_;
};

/// Waits at a warp intrinsic; returns the result the scheduler left.
std::uint64_t warp_op(const char* what, WarpOp op, unsigned mask, std::uint64_t value, int source) {
  Worker& w = self(what);
  if (w.abandon) throw Abandon{};
  w.wait = Wait::warp;
  w.op = op;
  w.mask = mask;
  w.value = value;
  w.source = source;
  ++current_run->at_warp;
  suspend(w);
  if (w.abandon) throw Abandon{};
  return w.result;
}

}  // namespace

std::string check_launch_shape(const LaunchShape& shape) {
  const dim3& b = shape.block;
  const dim3& g = shape.grid;
  const auto empty_axis = [](const dim3& d) -> const char* { return d.x == 0 ? "x" : d.y == 0 ? "y" : "z"; };
  if (b.x == 0 || b.y == 0 || b.z == 0)
    return spaced("block", b) + ": " + empty_axis(b) + " is 0; every extent must be at least 1";
  const std::uint64_t threads = std::uint64_t(b.x) * b.y * b.z;
  if (threads > max_block_threads)
    return spaced("block", b) + " has " + std::to_string(threads) + " threads; at most " +
           std::to_string(max_block_threads);
  // With at most 1024 threads, x and y are within their limit of 1024; only z (64) can exceed.
  if (b.z > 64) return spaced("block", b) + ": z is " + std::to_string(b.z) + "; at most 64";
  if (g.x == 0 || g.y == 0 || g.z == 0)
    return spaced("grid", g) + ": " + empty_axis(g) + " is 0; every extent must be at least 1";
  if (g.x > 0x7fffffffu) return spaced("grid", g) + ": x is " + std::to_string(g.x) + "; at most 2147483647";
  if (g.y > 65535u) return spaced("grid", g) + ": y is " + std::to_string(g.y) + "; at most 65535";
  if (g.z > 65535u) return spaced("grid", g) + ": z is " + std::to_string(g.z) + "; at most 65535";
  // An sm_90 block may have up to 227 KiB of dynamic shared memory, but only after
  // cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) raised the kernel's limit
  // on that device; without it the limit is 48 KiB.
  if (shape.dynamic_shared_bytes > shape.dynamic_shared_limit) {
    constexpr std::size_t default_shared = 48 * 1024;
    return "dynamic shared memory of " + std::to_string(shape.dynamic_shared_bytes) + " bytes; at most " +
           std::to_string(shape.dynamic_shared_limit) +
           (shape.dynamic_shared_limit == default_shared
                ? " (48 KiB) without cudaFuncSetAttribute"
                : " (the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize on this device)");
  }
  return {};
}

void run_grid(std::string_view kernel, const LaunchShape& shape, const std::function<void()>& thread_body) {
  if (std::string why = check_launch_shape(shape); !why.empty())
    throw DeviceFault{cudaErrorInvalidConfiguration, "kernel " + std::string(kernel) + ": " + why};
  Pool& p = pool();
  if (p.running)
    throw DeviceFault{cudaErrorNotSupported, "kernel " + std::string(kernel) +
                                                 ": launched from inside a running kernel (dynamic parallelism is "
                                                 "not emulated)"};
  Run run;
  run.kernel = kernel;
  run.shape = &shape;
  run.body = &thread_body;
  run.threads = shape.block.x * shape.block.y * shape.block.z;

  struct Active {
    Pool& p;
    void* tsan_caller;
    Active(Pool& pool, Run* r) : p(pool), tsan_caller(tsan_current()) {
      tsan_switch(p.tsan_grid());
      p.running = true;
      current_run = r;
    }
    ~Active() {
      p.running = false;
      current_run = nullptr;
      tsan_switch(tsan_caller);
    }
  } active(p, &run);
  p.reserve(run.threads);
  run.shared = p.shared(shape.dynamic_shared_bytes);

  BlockScheduler scheduler(p, run);
  const dim3& g = shape.grid;
  for (unsigned z = 0; z < g.z; ++z)
    for (unsigned y = 0; y < g.y; ++y)
      for (unsigned x = 0; x < g.x; ++x) {
        run.block = uint3{x, y, z};
        scheduler.run();
      }
}

std::string running_thread() {
  if (current_worker == nullptr || current_run == nullptr) return {};
  return kernel_prefix(*current_run) + "thread " + dims(current_worker->tid) + " of block " + dims(current_run->block);
}

const uint3& thread_index() { return self("threadIdx").tid; }
const uint3& block_index() {
  self("blockIdx");
  return current_run->block;
}
const dim3& block_dim() {
  self("blockDim");
  return current_run->shape->block;
}
const dim3& grid_dim() {
  self("gridDim");
  return current_run->shape->grid;
}
void* dynamic_shared_memory() {
  self("extern __shared__ memory");
  return current_run->shared;
}
unsigned lane_id() { return self("the lane id").linear % warp_size; }

void poison_static_shared(void* object, std::size_t bytes) {
  self("__shared__ memory");
  std::uint64_t& poisoned = shared_poisoned_in[object];
  if (poisoned == block_serial) return;  // another thread of this block got here first
  poisoned = block_serial;
  std::memset(object, 0xFF, bytes);
}

void async_copy(void* dst, const void* src, std::size_t bytes) {
  self("cp.async").uncommitted_copies.push_back({dst, src, bytes});
}

void async_copy_commit() {
  Worker& w = self("cp.async.commit_group");
  w.copy_groups.push_back(std::move(w.uncommitted_copies));
  w.uncommitted_copies.clear();
}

void async_copy_wait(int pending) {
  Worker& w = self("cp.async.wait_group");
  while (w.copy_groups.size() > static_cast<std::size_t>(pending < 0 ? 0 : pending)) {
    for (const Worker::AsyncCopy& c : w.copy_groups.front()) {
      if (c.src != nullptr) std::memcpy(c.dst, c.src, c.bytes);
      else std::memset(c.dst, 0, c.bytes);
    }
    w.copy_groups.pop_front();
  }
}

void sync_threads() {
  Worker& w = self("__syncthreads()");
  if (w.abandon) throw Abandon{};
  w.wait = Wait::barrier;
  ++current_run->at_barrier;
  suspend(w);
  if (w.abandon) throw Abandon{};
}

void sync_warp(unsigned mask) { warp_op("__syncwarp()", WarpOp::sync, mask, 0, 0); }

std::uint64_t exchange_in_warp(unsigned mask, std::uint64_t value, int source_lane) {
  return warp_op("__shfl_sync()", WarpOp::exchange, mask, value, source_lane);
}

unsigned ballot_in_warp(unsigned mask, bool predicate) {
  return static_cast<unsigned>(warp_op("__ballot_sync()", WarpOp::ballot, mask, predicate ? 1 : 0, 0));
}

std::size_t pooled_fiber_stacks() { return pool().size(); }

}  // namespace polyshard::emulation
