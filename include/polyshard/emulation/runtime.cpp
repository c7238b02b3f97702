// The emulated CUDA runtime: devices, device and pinned memory, streams that run their work on
// worker threads, events, stream-ordered pools and CUDA's error model, defined behind the real
// cuda_runtime_api.h declarations so that a program built against CUDA links against this instead.
//
// Written from the CUDA Runtime API documentation's description of each call. Where the emulation
// differs from a GPU on purpose, the comment at the definition says so.
#include "polyshard/emulation/runtime.hpp"
#include "polyshard/emulation/initcheck.hpp"

#include "polyshard/core/cuda/runtime.hpp"  // cuda::emulated_device_name

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace polyshard::emulation {
namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Configuration, read once.

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (end && *end == '\0') ? static_cast<int>(n) : fallback;
}

int configured_devices() {
  static const int n = std::clamp(env_int("POLYSHARD_EMULATION_DEVICES", 4), 0, 64);
  return n;
}

// The figures an H100 SXM reports, so that code sizing launches or buffers from the properties
// behaves as on the GPU the project targets. Memory is only limited by the host's.
constexpr std::size_t total_global_memory = std::size_t{80} << 30;
constexpr int least_stream_priority = 0;
constexpr int greatest_stream_priority = -5;
constexpr std::size_t device_alignment = 256;  // cudaMalloc's documented minimum alignment
constexpr std::size_t host_alignment = 4096;   // pinned memory comes in pages
constexpr unsigned char poison_byte = 0xFF;    // NaN in every floating-point format

// ---------------------------------------------------------------------------------------------
// Errors: the calling thread's last error, and the message of the last fault or refused launch.

thread_local cudaError_t t_last_error = cudaSuccess;

/// Every runtime call returns through here, so that a failure is also cudaGetLastError's answer.
cudaError_t result(cudaError_t rc) {
  if (rc != cudaSuccess) t_last_error = rc;
  return rc;
}

struct Messages {
  std::mutex m;
  std::string last;
};
// Never destroyed: a worker thread may report a fault while the process exits.
Messages& messages() {
  static auto* p = new Messages;
  return *p;
}
void remember(const std::string& message) {
  {
    std::lock_guard lock(messages().m);
    messages().last = message;
  }
  std::fprintf(stderr, "polyshard emulated CUDA: %s\n", message.c_str());
}

/// Refuses a call with `code`, reported like a refused launch (printed, kept, last error).
cudaError_t refuse(cudaError_t code, std::string message) {
  report_launch_error(code, std::move(message));
  return code;
}

std::string pointer_text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// ---------------------------------------------------------------------------------------------
// Streams, devices.

struct Stream;

/// "Do not start before `stream` has completed `position` pieces of work."
struct Dependency {
  std::shared_ptr<Stream> stream;
  std::uint64_t position = 0;
};

struct Task {
  std::string what;
  Work work;
  std::vector<Dependency> after;
  bool essential = false;  // runtime bookkeeping (event records, frees): runs after a fault too
};

struct Stream {
  int device = 0;
  unsigned flags = cudaStreamDefault;
  int priority = 0;
  bool legacy = false;
  unsigned long long id = 0;  // cudaStreamGetId: unique for the life of the program

  std::mutex m;
  std::condition_variable has_work;    // the worker waits on it
  std::condition_variable progressed;  // waiters for `completed` wait on it
  std::deque<Task> queue;
  std::uint64_t enqueued = 0;   // pieces of work ever enqueued; a position is a value of it
  std::uint64_t completed = 0;  // pieces of work done (or skipped after a fault)
  bool closing = false;         // cudaStreamDestroy: the worker ends once the queue is empty

  bool blocking() const { return legacy || (flags & cudaStreamNonBlocking) == 0; }
};

struct Pool;

struct Device {
  int index = 0;
  std::atomic<int> sticky{cudaSuccess};  // the device's sticky error (cudaSuccess: none)
  std::mutex m;                          // guards fault, streams, default_pool
  std::string fault;
  std::shared_ptr<Stream> legacy;                // the legacy default stream, never destroyed
  std::vector<std::shared_ptr<Stream>> streams;  // created streams, until destroyed and drained
  std::shared_ptr<Pool> default_pool;
};

void worker_loop(const std::shared_ptr<Stream>& s);

std::shared_ptr<Stream> make_stream(int device, unsigned flags, int priority, bool legacy) {
  static std::atomic<unsigned long long> next_id{1};
  auto s = std::make_shared<Stream>();
  s->id = next_id++;
  s->device = device;
  s->flags = flags;
  s->priority = priority;
  s->legacy = legacy;
  // Each stream's worker holds the stream and is detached: cudaStreamDestroy returns at once
  // while queued work finishes, as CUDA documents, and a program that exits with streams alive
  // leaves its idle workers blocked on a condition variable of objects that are never freed.
  if (!synchronous_mode()) std::thread([s] { worker_loop(s); }).detach();
  return s;
}

// Never destroyed, for the same reason as messages().
std::vector<Device*>& device_table() {
  static auto* table = [] {
    auto* t = new std::vector<Device*>;
    for (int i = 0; i < configured_devices(); ++i) {
      auto* d = new Device;
      d->index = i;
      d->legacy = make_stream(i, cudaStreamDefault, 0, /*legacy=*/true);
      t->push_back(d);
    }
    return t;
  }();
  return *table;
}

bool valid_device(int device) { return device >= 0 && device < configured_devices(); }
Device& device_at(int device) { return *device_table()[static_cast<std::size_t>(device)]; }

cudaError_t sticky_of(int device) {
  return valid_device(device) ? static_cast<cudaError_t>(device_at(device).sticky.load()) : cudaSuccess;
}

/// Makes `code` the device's sticky error; only the first fault is kept and printed.
void fault(int device, cudaError_t code, std::string message) {
  if (code == cudaSuccess) code = cudaErrorLaunchFailure;
  Device& d = device_at(device);
  {
    std::lock_guard lock(d.m);
    if (d.sticky.load() != cudaSuccess) return;
    d.fault = message;
    d.sticky.store(code);
  }
  remember(message);
}

void wait_reached(Stream& s, std::uint64_t position) {
  std::unique_lock lock(s.m);
  s.progressed.wait(lock, [&] { return s.completed >= position; });
}

/// Runs one piece of work after its dependencies, turning what it throws into the sticky error.
void execute(Stream& s, Task& task) {
  for (const Dependency& dep : task.after) wait_reached(*dep.stream, dep.position);
  Device& d = device_at(s.device);
  // After a fault the device runs nothing but bookkeeping, as a GPU whose context is lost.
  if (task.essential || d.sticky.load() == cudaSuccess) {
    try {
      task.work();
    } catch (const DeviceFault& f) {
      fault(s.device, f.code, f.message);
    } catch (const std::exception& e) {
      fault(s.device, cudaErrorLaunchFailure, task.what + ": " + e.what());
    } catch (...) {
      fault(s.device, cudaErrorLaunchFailure, task.what + ": an unknown exception");
    }
  }
  // The work's captured state is released by the caller after completion shows: NCCL counts a
  // collective as in flight until then, so a finalize that returned leaves the stream past it.
  {
    std::lock_guard lock(s.m);
    ++s.completed;
  }
  s.progressed.notify_all();
}

void worker_loop(const std::shared_ptr<Stream>& sp) {
  Stream& s = *sp;
  for (;;) {
    Task task;
    {
      std::unique_lock lock(s.m);
      s.has_work.wait(lock, [&] { return s.closing || !s.queue.empty(); });
      if (s.queue.empty()) return;
      task = std::move(s.queue.front());
      s.queue.pop_front();
    }
    execute(s, task);
  }
}

/// Whether a destroyed stream has finished its work (the device may then forget it). Locks s.m.
bool drained(Stream& s) {
  std::lock_guard lock(s.m);
  return s.closing && s.completed == s.enqueued;
}

void prune(Device& d) {  // d.m held
  std::erase_if(d.streams, [](const std::shared_ptr<Stream>& s) { return drained(*s); });
}

void add_unfinished(const std::shared_ptr<Stream>& s, std::vector<Dependency>& after) {
  std::lock_guard lock(s->m);
  if (s->completed < s->enqueued) after.push_back({s, s->enqueued});
}

/// Appends a piece of work to `sp`'s queue and returns its position. The legacy stream's
/// implicit ordering is made of dependencies taken here: work on the legacy stream waits for
/// the work enqueued so far on the device's blocking streams, and work on a blocking stream
/// waits for the legacy stream's.
std::uint64_t push(const std::shared_ptr<Stream>& sp, std::string what, Work work, std::vector<Dependency> after = {},
                   bool essential = false) {
  Stream& s = *sp;
  Device& d = device_at(s.device);
  if (s.legacy) {
    std::lock_guard lock(d.m);
    prune(d);
    for (const auto& other : d.streams)
      if (other->blocking()) add_unfinished(other, after);
  } else if (s.blocking()) {
    add_unfinished(d.legacy, after);
  }
  Task task{std::move(what), std::move(work), std::move(after), essential};
  if (synchronous_mode()) {
    // Runs on the calling thread, still in the stream's order if several threads share it.
    std::uint64_t position = 0;
    {
      std::unique_lock lock(s.m);
      position = ++s.enqueued;
      s.progressed.wait(lock, [&] { return s.completed + 1 == position; });
    }
    execute(s, task);
    return position;
  }
  std::uint64_t position = 0;
  {
    std::lock_guard lock(s.m);
    position = ++s.enqueued;
    s.queue.push_back(std::move(task));
  }
  s.has_work.notify_one();
  return position;
}

// ---------------------------------------------------------------------------------------------
// Handles: streams, events and pools are looked up, so that a stale or foreign handle is
// cudaErrorInvalidResourceHandle instead of a crash.

struct Event {
  unsigned flags = cudaEventDefault;
  std::mutex m;
  std::shared_ptr<Stream> stream;  // null: never recorded
  std::uint64_t position = 0;
  std::uint64_t generation = 0;  // which record the timestamp belongs to
  Clock::time_point time;
  bool timed = false;
};

struct Pool {
  int device = 0;
  std::mutex m;
  std::uint64_t release_threshold = 0;
  std::uint64_t used = 0, used_high = 0, reserved_high = 0;
  int reuse_follow_events = 1, reuse_opportunistic = 1, reuse_internal_dependencies = 1;
};

struct Handles {
  std::shared_mutex m;
  std::unordered_map<const void*, std::shared_ptr<Stream>> streams;
  std::unordered_map<const void*, std::shared_ptr<Event>> events;
  std::unordered_map<const void*, std::shared_ptr<Pool>> pools;
  // Stream handles are small multiples of 16 from 0x10000, clear of the special streams; a
  // destroyed stream's handle goes to the next stream created (take_stream_handle).
  std::set<std::uintptr_t> free_stream_handles;
  std::uintptr_t next_stream_handle = 0x10000;
};
Handles& handles() {
  static auto* p = new Handles;
  return *p;
}

thread_local int t_device = 0;

bool is_default_stream(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }

/// Lets `s`'s worker end once its queue is empty (cudaStreamDestroy, a thread's exit).
void close_stream(Stream& s) {
  {
    std::lock_guard lock(s.m);
    s.closing = true;
  }
  s.has_work.notify_one();
}

/// The calling thread's per-thread default stream on `device`, made on first use. CUDA gives each
/// host thread one: an ordinary blocking stream (ordered with the legacy stream, as a created
/// blocking stream is) that other threads' work does not wait for. It closes when the thread
/// exits, its queued work finishing first.
std::shared_ptr<Stream> per_thread_stream(int device) {
  struct Owned {
    std::map<int, std::shared_ptr<Stream>> streams;
    ~Owned() {
      for (auto& [index, s] : streams) close_stream(*s);
    }
  };
  thread_local Owned owned;
  std::shared_ptr<Stream>& s = owned.streams[device];
  if (!s) {
    s = make_stream(device, cudaStreamDefault, 0, /*legacy=*/false);
    Device& d = device_at(device);
    std::lock_guard lock(d.m);
    prune(d);
    d.streams.push_back(s);
  }
  return s;
}

/// The stream behind a handle: the null handle and cudaStreamLegacy are the current device's
/// legacy stream, cudaStreamPerThread the calling thread's own default stream on it.
std::shared_ptr<Stream> find_stream(cudaStream_t handle) {
  if (handle == cudaStreamPerThread) return valid_device(t_device) ? per_thread_stream(t_device) : nullptr;
  if (is_default_stream(handle)) return valid_device(t_device) ? device_at(t_device).legacy : nullptr;
  std::shared_lock lock(handles().m);
  const auto it = handles().streams.find(handle);
  return it == handles().streams.end() ? nullptr : it->second;
}

std::shared_ptr<Event> find_event(cudaEvent_t handle) {
  std::shared_lock lock(handles().m);
  const auto it = handles().events.find(handle);
  return it == handles().events.end() ? nullptr : it->second;
}

std::shared_ptr<Pool> find_pool(cudaMemPool_t handle) {
  std::shared_lock lock(handles().m);
  const auto it = handles().pools.find(handle);
  return it == handles().pools.end() ? nullptr : it->second;
}

/// Waits for everything enqueued so far on `s`. The legacy stream waits through a marker, which
/// carries its implicit dependencies on the blocking streams.
void synchronize(const std::shared_ptr<Stream>& s) {
  std::uint64_t position = 0;
  if (s->legacy) {
    position = push(
        s, "cudaStreamSynchronize", [] {}, {}, true);
  } else {
    std::lock_guard lock(s->m);
    position = s->enqueued;
  }
  wait_reached(*s, position);
}

void synchronize_device(int device) {
  Device& d = device_at(device);
  std::vector<Dependency> pending;
  {
    std::lock_guard lock(d.m);
    prune(d);
    for (const auto& s : d.streams) add_unfinished(s, pending);
  }
  synchronize(d.legacy);
  for (const Dependency& dep : pending) wait_reached(*dep.stream, dep.position);
}

// ---------------------------------------------------------------------------------------------
// Memory: every live allocation by address.

struct Allocation {
  MemoryKind kind = MemoryKind::unknown;
  int device = -1;
  std::size_t size = 0;
  std::shared_ptr<Pool> pool;  // for stream-ordered allocations
  bool freeing = false;        // a cudaFreeAsync is queued
};

struct Memory {
  std::shared_mutex m;
  std::map<std::uintptr_t, Allocation> blocks;
};
Memory& memory() {
  static auto* p = new Memory;
  return *p;
}

std::size_t alignment_of(MemoryKind kind) { return kind == MemoryKind::device ? device_alignment : host_alignment; }

void* allocate(MemoryKind kind, std::size_t size, int device, std::shared_ptr<Pool> pool) {
  void* p = ::operator new (size, std::align_val_t{alignment_of(kind)}, std::nothrow);
  if (!p) return nullptr;
  // Unwritten device memory reads as NaN, so that a missing initialisation shows in results.
  if (kind == MemoryKind::device) {
    std::memset(p, poison_byte, size);
    initcheck::allocated(p, size);
  }
  std::unique_lock lock(memory().m);
  memory().blocks[reinterpret_cast<std::uintptr_t>(p)] = Allocation{kind, device, size, std::move(pool), false};
  return p;
}

void release(void* p) {
  Allocation a;
  {
    std::unique_lock lock(memory().m);
    const auto it = memory().blocks.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == memory().blocks.end()) return;
    a = std::move(it->second);
    memory().blocks.erase(it);
  }
  if (a.pool) {
    std::lock_guard lock(a.pool->m);
    a.pool->used -= a.size;
  }
  if (a.kind == MemoryKind::device) initcheck::released(p, a.size);
  ::operator delete (p, std::align_val_t{alignment_of(a.kind)});
}

/// Claims the allocation starting at `p` of kind `kind` for freeing; empty, or why not.
std::string claim_for_free(void* p, MemoryKind kind, Allocation* out) {
  std::unique_lock lock(memory().m);
  const auto it = memory().blocks.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == memory().blocks.end() || it->second.kind != kind || it->second.freeing)
    return pointer_text(p) +
           (kind == MemoryKind::device ? " is not a live device allocation"
                                       : " is not a live cudaHostAlloc allocation") +
           " (never allocated, freed already, or not the first byte of one)";
  it->second.freeing = true;
  *out = it->second;
  return {};
}

std::string memory_kind_text(const PointerInfo& info) {
  switch (info.kind) {
    case MemoryKind::device:
      return "device memory of device " + std::to_string(info.device);
    case MemoryKind::pinned_host:
      return "pinned host memory";
    default:
      return "pageable host memory";
  }
}

/// Checks one side of a copy or set: `device_side` wants memory the device can address (device
/// or pinned), else host memory. A pointer into a known allocation must keep [p, p+n) inside it.
std::string check_side(const char* call, const char* role, const void* p, std::size_t n, bool device_side,
                       bool host_side, PointerInfo* info) {
  *info = find_pointer(p);
  const std::string head = std::string(call) + ": " + role + " " + pointer_text(p);
  if (device_side && !host_side && info->kind == MemoryKind::unknown)
    return head + " is not in a live device allocation (never allocated, or freed)";
  if (host_side && !device_side && info->kind == MemoryKind::device)
    return head + " is " + memory_kind_text(*info) + " but the copy direction says host memory";
  if (info->kind != MemoryKind::unknown) {
    const auto offset = static_cast<std::size_t>(static_cast<const char*>(p) - static_cast<const char*>(info->base));
    if (n > info->size - offset)
      return head + ": " + std::to_string(n) + " bytes at offset " + std::to_string(offset) + " run past the end of " +
             memory_kind_text(*info) + " of " + std::to_string(info->size) + " bytes";
  }
  return {};
}

/// A copy on `handle`'s stream with CUDA's rules for pageable host memory: a source in pageable
/// memory is staged before the call returns, a pageable destination makes the call wait. A
/// synchronous call (cudaMemcpy) always waits.
cudaError_t copy(const char* call, void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, cudaStream_t handle,
                 bool synchronous) {
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return refuse(cudaErrorInvalidValue, std::string(call) + ": a null pointer");
  const auto stream = find_stream(handle);
  if (!stream) return refuse(cudaErrorInvalidResourceHandle, std::string(call) + ": not a live stream");
  bool src_device = false, src_host = false, dst_device = false, dst_host = false;
  switch (kind) {
    case cudaMemcpyHostToHost:
      src_host = dst_host = true;
      break;
    case cudaMemcpyHostToDevice:
      src_host = dst_device = true;
      break;
    case cudaMemcpyDeviceToHost:
      src_device = dst_host = true;
      break;
    case cudaMemcpyDeviceToDevice:
      src_device = dst_device = true;
      break;
    case cudaMemcpyDefault:
      src_device = src_host = dst_device = dst_host = true;
      break;
    default:
      return refuse(cudaErrorInvalidMemcpyDirection, std::string(call) + ": not a copy direction");
  }
  PointerInfo s{}, d{};
  std::string why = check_side(call, "source", src, n, src_device, src_host, &s);
  if (why.empty()) why = check_side(call, "destination", dst, n, dst_device, dst_host, &d);
  if (!why.empty()) return refuse(cudaErrorInvalidValue, why);

  const bool pageable_src = s.kind == MemoryKind::unknown;
  const bool pageable_dst = d.kind == MemoryKind::unknown;
  std::uint64_t position = 0;
  if (pageable_src && !synchronous) {
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + n);
    position = push(stream, call, [dst, staged] {
      std::memcpy(dst, staged->data(), staged->size());
      initcheck::written(dst, staged->size());
    });
  } else {
    position = push(stream, call, [dst, src, n] {
      std::memmove(dst, src, n);
      initcheck::written(dst, n);
    });
  }
  if (synchronous || pageable_dst) {
    wait_reached(*stream, position);
    return sticky_of(stream->device);
  }
  return cudaSuccess;
}

cudaError_t set(const char* call, void* dst, int value, std::size_t n, cudaStream_t handle, bool wait) {
  if (n == 0) return cudaSuccess;
  const auto stream = find_stream(handle);
  if (!stream) return refuse(cudaErrorInvalidResourceHandle, std::string(call) + ": not a live stream");
  PointerInfo info{};
  const std::string why = check_side(call, "destination", dst, n, true, false, &info);
  if (!why.empty()) return refuse(cudaErrorInvalidValue, why);
  const std::uint64_t position = push(stream, call, [dst, value, n] {
    std::memset(dst, value, n);
    initcheck::written(dst, n);
  });
  if (wait) {
    wait_reached(*stream, position);
    return sticky_of(stream->device);
  }
  return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// Device properties.

cudaDeviceProp properties_of(int device) {
  cudaDeviceProp p;
  std::memset(&p, 0, sizeof p);
  std::snprintf(p.name, sizeof p.name, "%s", polyshard::cuda::emulated_device_name);
  for (std::size_t i = 0; i < sizeof p.uuid.bytes; ++i) p.uuid.bytes[i] = static_cast<char>(0x50 + i);
  p.uuid.bytes[15] = static_cast<char>(device);
  p.totalGlobalMem = total_global_memory;
  p.sharedMemPerBlock = 48 * 1024;
  p.sharedMemPerBlockOptin = 227 * 1024;
  p.sharedMemPerMultiprocessor = 228 * 1024;
  p.reservedSharedMemPerBlock = 1024;
  p.regsPerBlock = 65536;
  p.regsPerMultiprocessor = 65536;
  p.warpSize = 32;
  p.memPitch = 2147483647;
  p.maxThreadsPerBlock = 1024;
  p.maxThreadsDim[0] = 1024, p.maxThreadsDim[1] = 1024, p.maxThreadsDim[2] = 64;
  p.maxGridSize[0] = 2147483647, p.maxGridSize[1] = 65535, p.maxGridSize[2] = 65535;
  p.totalConstMem = 64 * 1024;
  p.major = 9;
  p.minor = 0;
  p.textureAlignment = 512;
  p.texturePitchAlignment = 32;
  p.surfaceAlignment = 512;
  p.multiProcessorCount = 132;
  p.maxThreadsPerMultiProcessor = 2048;
  p.maxBlocksPerMultiProcessor = 32;
  p.l2CacheSize = 50 * 1024 * 1024;
  p.persistingL2CacheMaxSize = 31 * 1024 * 1024;
  p.accessPolicyMaxWindowSize = 128 * 1024 * 1024;
  p.memoryBusWidth = 5120;
  p.canMapHostMemory = 1;
  p.concurrentKernels = 1;
  p.ECCEnabled = 1;
  p.pciBusID = 0x18 + device;
  p.asyncEngineCount = 3;
  p.unifiedAddressing = 1;
  p.streamPrioritiesSupported = 1;
  p.globalL1CacheSupported = 1;
  p.localL1CacheSupported = 1;
  p.managedMemory = 1;
  p.computePreemptionSupported = 1;
  p.cooperativeLaunch = 1;
  p.hostRegisterSupported = 1;
  p.memoryPoolsSupported = 1;
  p.clusterLaunch = 1;
  p.unifiedFunctionPointers = 1;
  p.deviceNumaId = -1;
  p.hostNumaId = -1;
  return p;
}

/// cudaFuncAttributeMaxDynamicSharedMemorySize as set per (device, kernel).
struct DynamicSharedLimits {
  std::mutex m;
  std::map<std::pair<int, const void*>, std::size_t> bytes;
};

DynamicSharedLimits& dynamic_shared_limits() {
  static DynamicSharedLimits limits;
  return limits;
}

}  // namespace

// =============================================================================================
// runtime.hpp

int current_device() { return t_device; }

std::size_t dynamic_shared_limit(const void* kernel) {
  DynamicSharedLimits& limits = dynamic_shared_limits();
  const std::lock_guard lock(limits.m);
  const auto it = limits.bytes.find({t_device, kernel});
  return it == limits.bytes.end() ? std::size_t{48 * 1024} : it->second;
}

int stream_device(cudaStream_t stream) {
  const auto s = find_stream(stream);
  return s ? s->device : -1;
}

void enqueue(cudaStream_t stream, std::string what, Work work) {
  const auto s = find_stream(stream);
  if (!s) {
    report_launch_error(cudaErrorInvalidResourceHandle,
                        what + ": stream " + pointer_text(stream) + " is not a live stream");
    return;
  }
  push(s, std::move(what), std::move(work));
}

void report_launch_error(cudaError_t code, std::string message) {
  t_last_error = code;
  remember(message);
}

std::string last_fault_message() {
  std::lock_guard lock(messages().m);
  return messages().last;
}

PointerInfo find_pointer(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::shared_lock lock(memory().m);
  auto it = memory().blocks.upper_bound(address);
  if (it == memory().blocks.begin()) return {};
  --it;
  if (address - it->first >= it->second.size) return {};
  return {it->second.kind, it->second.device, reinterpret_cast<const void*>(it->first), it->second.size};
}

bool synchronous_mode() {
  static const bool on = env_int("POLYSHARD_EMULATION_SYNC", 0) != 0;
  return on;
}

}  // namespace polyshard::emulation

// =============================================================================================
// The CUDA runtime API.

using namespace polyshard::emulation;
namespace emu = polyshard::emulation;

namespace {

/// A stream's handle is the address of its state (looked up in handles(), never dereferenced).
/// A handle for a new stream: the lowest one a destroyed stream gave back, else a new one. A
/// driver hands out a destroyed stream's handle again too; doing it at once, every time, lets
/// tests show what keys state by a stream's handle rather than by the stream (cudaStreamGetId).
/// handles().m held.
cudaStream_t take_stream_handle() {
  Handles& h = handles();
  std::uintptr_t value = h.next_stream_handle;
  if (!h.free_stream_handles.empty()) {
    value = *h.free_stream_handles.begin();
    h.free_stream_handles.erase(h.free_stream_handles.begin());
  } else {
    h.next_stream_handle += 16;
  }
  return reinterpret_cast<cudaStream_t>(value);
}

const char* error_name(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError:
      return "cudaErrorInitializationError";
    case cudaErrorCudartUnloading:
      return "cudaErrorCudartUnloading";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidPitchValue:
      return "cudaErrorInvalidPitchValue";
    case cudaErrorInvalidSymbol:
      return "cudaErrorInvalidSymbol";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorMissingConfiguration:
      return "cudaErrorMissingConfiguration";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorLaunchTimeout:
      return "cudaErrorLaunchTimeout";
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
    case cudaErrorInvalidDeviceFunction:
      return "cudaErrorInvalidDeviceFunction";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorNoKernelImageForDevice:
      return "cudaErrorNoKernelImageForDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorAssert:
      return "cudaErrorAssert";
    case cudaErrorIllegalInstruction:
      return "cudaErrorIllegalInstruction";
    case cudaErrorMisalignedAddress:
      return "cudaErrorMisalignedAddress";
    case cudaErrorNotPermitted:
      return "cudaErrorNotPermitted";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorUnknown:
      return "cudaErrorUnknown";
    default:
      return "unrecognized error code";
  }
}

const char* error_description(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInitializationError:
      return "initialization error";
    case cudaErrorCudartUnloading:
      return "driver shutting down";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidPitchValue:
      return "invalid pitch argument";
    case cudaErrorInvalidSymbol:
      return "invalid device symbol";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorMissingConfiguration:
      return "__global__ function call is not configured";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorLaunchTimeout:
      return "the launch timed out and was terminated";
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch";
    case cudaErrorInvalidDeviceFunction:
      return "invalid device function";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorNoKernelImageForDevice:
      return "no kernel image is available for execution on the device";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorAssert:
      return "device-side assert triggered";
    case cudaErrorIllegalInstruction:
      return "an illegal instruction was encountered";
    case cudaErrorMisalignedAddress:
      return "misaligned address";
    case cudaErrorNotPermitted:
      return "operation not permitted";
    case cudaErrorNotSupported:
      return "operation not supported";
    case cudaErrorUnknown:
      return "unknown error";
    default:
      return "unrecognized error code";
  }
}

cudaError_t current_device_checked() {
  if (configured_devices() == 0) return cudaErrorNoDevice;
  return valid_device(t_device) ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t create_stream(cudaStream_t* out, unsigned flags, int priority) {
  if (!out || (flags & ~unsigned{cudaStreamNonBlocking}) != 0) return result(cudaErrorInvalidValue);
  if (const cudaError_t rc = current_device_checked(); rc != cudaSuccess) return result(rc);
  // Out-of-range priorities are clamped, as CUDA documents.
  priority = std::clamp(priority, greatest_stream_priority, least_stream_priority);
  auto s = make_stream(t_device, flags, priority, false);
  cudaStream_t handle = nullptr;
  {
    std::unique_lock lock(handles().m);
    handle = take_stream_handle();
    handles().streams[handle] = s;
  }
  Device& d = device_at(t_device);
  {
    std::lock_guard lock(d.m);
    prune(d);
    d.streams.push_back(s);
  }
  *out = handle;
  return cudaSuccess;
}

std::shared_ptr<Pool> default_pool(int device) {
  Device& d = device_at(device);
  std::lock_guard lock(d.m);
  if (!d.default_pool) {
    d.default_pool = std::make_shared<Pool>();
    d.default_pool->device = device;
  }
  return d.default_pool;
}

cudaError_t allocate_from_pool(void** out, std::size_t size, const std::shared_ptr<Pool>& pool, cudaStream_t stream) {
  if (!out) return result(cudaErrorInvalidValue);
  if (!find_stream(stream)) return result(cudaErrorInvalidResourceHandle);
  *out = nullptr;
  if (size == 0) return cudaSuccess;
  // Allocated at once (the memory is the host's), poisoned; usable once the stream gets there,
  // which here is at once too: stream order matters for the free only.
  void* p = emu::allocate(MemoryKind::device, size, pool->device, pool);
  if (!p) return result(cudaErrorMemoryAllocation);
  {
    std::lock_guard lock(pool->m);
    pool->used += size;
    pool->used_high = std::max(pool->used_high, pool->used);
    pool->reserved_high = std::max(pool->reserved_high, pool->used);
  }
  *out = p;
  return cudaSuccess;
}

}  // namespace

extern "C" {

// ---- Errors ----------------------------------------------------------------------------------

/// Returns and clears the thread's last error; a device's sticky error cannot be cleared.
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  if (e != cudaSuccess) return e;
  return sticky_of(t_device);
}

cudaError_t cudaPeekAtLastError(void) {
  if (t_last_error != cudaSuccess) return t_last_error;
  return sticky_of(t_device);
}

const char* cudaGetErrorName(cudaError_t error) { return error_name(error); }
const char* cudaGetErrorString(cudaError_t error) { return error_description(error); }

// ---- Devices ---------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return result(cudaErrorInvalidValue);
  *count = configured_devices();
  return *count == 0 ? result(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (configured_devices() == 0) return result(cudaErrorNoDevice);
  if (!valid_device(device)) return result(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return result(cudaErrorInvalidValue);
  if (const cudaError_t rc = current_device_checked(); rc != cudaSuccess) return result(rc);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return result(cudaErrorInvalidValue);
  if (!valid_device(device)) return result(cudaErrorInvalidDevice);
  *prop = properties_of(device);
  return cudaSuccess;
}

/// The attributes a kernel of this project may set: the dynamic shared memory it may take (up to
/// the device's opt-in limit, 227 KiB), kept per device as a GPU keeps it; the carveout is a hint
/// (accepted, without effect, as a GPU may).
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (!func) return result(cudaErrorInvalidDeviceFunction);
  if (const cudaError_t rc = current_device_checked(); rc != cudaSuccess) return result(rc);
  switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize: {
      if (value < 0 || std::size_t(value) > properties_of(t_device).sharedMemPerBlockOptin)
        return result(cudaErrorInvalidValue);
      DynamicSharedLimits& limits = dynamic_shared_limits();
      const std::lock_guard lock(limits.m);
      limits.bytes[{t_device, func}] = std::size_t(value);
      return cudaSuccess;
    }
    case cudaFuncAttributePreferredSharedMemoryCarveout:
      return value < -1 || value > 100 ? result(cudaErrorInvalidValue) : cudaSuccess;
    default:
      return result(cudaErrorInvalidValue);
  }
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value) return result(cudaErrorInvalidValue);
  if (!valid_device(device)) return result(cudaErrorInvalidDevice);
  const cudaDeviceProp p = properties_of(device);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = p.maxThreadsPerBlock;
      break;
    case cudaDevAttrMaxBlockDimX:
      *value = p.maxThreadsDim[0];
      break;
    case cudaDevAttrMaxBlockDimY:
      *value = p.maxThreadsDim[1];
      break;
    case cudaDevAttrMaxBlockDimZ:
      *value = p.maxThreadsDim[2];
      break;
    case cudaDevAttrMaxGridDimX:
      *value = p.maxGridSize[0];
      break;
    case cudaDevAttrMaxGridDimY:
      *value = p.maxGridSize[1];
      break;
    case cudaDevAttrMaxGridDimZ:
      *value = p.maxGridSize[2];
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(p.sharedMemPerBlock);
      break;
    case cudaDevAttrTotalConstantMemory:
      *value = static_cast<int>(p.totalConstMem);
      break;
    case cudaDevAttrWarpSize:
      *value = p.warpSize;
      break;
    case cudaDevAttrMaxPitch:
      *value = static_cast<int>(p.memPitch);
      break;
    case cudaDevAttrMaxRegistersPerBlock:
      *value = p.regsPerBlock;
      break;
    case cudaDevAttrClockRate:
      *value = 1980000;
      break;  // kHz
    case cudaDevAttrMemoryClockRate:
      *value = 2619000;
      break;
    case cudaDevAttrTextureAlignment:
      *value = static_cast<int>(p.textureAlignment);
      break;
    case cudaDevAttrMultiProcessorCount:
      *value = p.multiProcessorCount;
      break;
    case cudaDevAttrIntegrated:
      *value = p.integrated;
      break;
    case cudaDevAttrCanMapHostMemory:
      *value = p.canMapHostMemory;
      break;
    case cudaDevAttrComputeMode:
      *value = cudaComputeModeDefault;
      break;
    case cudaDevAttrConcurrentKernels:
      *value = p.concurrentKernels;
      break;
    case cudaDevAttrEccEnabled:
      *value = p.ECCEnabled;
      break;
    case cudaDevAttrPciBusId:
      *value = p.pciBusID;
      break;
    case cudaDevAttrPciDeviceId:
      *value = p.pciDeviceID;
      break;
    case cudaDevAttrPciDomainId:
      *value = p.pciDomainID;
      break;
    case cudaDevAttrAsyncEngineCount:
      *value = p.asyncEngineCount;
      break;
    case cudaDevAttrUnifiedAddressing:
      *value = p.unifiedAddressing;
      break;
    case cudaDevAttrGlobalMemoryBusWidth:
      *value = p.memoryBusWidth;
      break;
    case cudaDevAttrL2CacheSize:
      *value = p.l2CacheSize;
      break;
    case cudaDevAttrMaxThreadsPerMultiProcessor:
      *value = p.maxThreadsPerMultiProcessor;
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = p.major;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = p.minor;
      break;
    case cudaDevAttrStreamPrioritiesSupported:
      *value = p.streamPrioritiesSupported;
      break;
    case cudaDevAttrGlobalL1CacheSupported:
      *value = p.globalL1CacheSupported;
      break;
    case cudaDevAttrLocalL1CacheSupported:
      *value = p.localL1CacheSupported;
      break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
      *value = static_cast<int>(p.sharedMemPerMultiprocessor);
      break;
    case cudaDevAttrMaxRegistersPerMultiprocessor:
      *value = p.regsPerMultiprocessor;
      break;
    case cudaDevAttrManagedMemory:
      *value = p.managedMemory;
      break;
    case cudaDevAttrIsMultiGpuBoard:
      *value = p.isMultiGpuBoard;
      break;
    case cudaDevAttrComputePreemptionSupported:
      *value = p.computePreemptionSupported;
      break;
    case cudaDevAttrCooperativeLaunch:
      *value = p.cooperativeLaunch;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(p.sharedMemPerBlockOptin);
      break;
    case cudaDevAttrMaxBlocksPerMultiprocessor:
      *value = p.maxBlocksPerMultiProcessor;
      break;
    case cudaDevAttrMaxPersistingL2CacheSize:
      *value = p.persistingL2CacheMaxSize;
      break;
    case cudaDevAttrMaxAccessPolicyWindowSize:
      *value = p.accessPolicyMaxWindowSize;
      break;
    case cudaDevAttrReservedSharedMemoryPerBlock:
      *value = static_cast<int>(p.reservedSharedMemPerBlock);
      break;
    case cudaDevAttrHostRegisterSupported:
      *value = p.hostRegisterSupported;
      break;
    case cudaDevAttrMemoryPoolsSupported:
      *value = p.memoryPoolsSupported;
      break;
    case cudaDevAttrClusterLaunch:
      *value = p.clusterLaunch;
      break;
    case cudaDevAttrPageableMemoryAccess:
      *value = p.pageableMemoryAccess;
      break;
    case cudaDevAttrConcurrentManagedAccess:
      *value = p.concurrentManagedAccess;
      break;
    default:
      return result(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  if (leastPriority) *leastPriority = least_stream_priority;
  if (greatestPriority) *greatestPriority = greatest_stream_priority;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  if (const cudaError_t rc = current_device_checked(); rc != cudaSuccess) return result(rc);
  synchronize_device(t_device);
  return result(sticky_of(t_device));
}

/// Waits for the device's work and clears its sticky error. Unlike CUDA it does not free the
/// device's allocations or destroy its streams: other threads may still hold them.
cudaError_t cudaDeviceReset(void) {
  if (const cudaError_t rc = current_device_checked(); rc != cudaSuccess) return result(rc);
  synchronize_device(t_device);
  Device& d = device_at(t_device);
  std::lock_guard lock(d.m);
  d.sticky.store(cudaSuccess);
  d.fault.clear();
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (!free || !total) return result(cudaErrorInvalidValue);
  *free = *total = total_global_memory;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (!version) return result(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (!version) return result(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

/// Every pair of emulated devices shares the host's memory: peer access always works.
cudaError_t cudaDeviceCanAccessPeer(int* canAccessPeer, int device, int peerDevice) {
  if (!canAccessPeer) return result(cudaErrorInvalidValue);
  if (!valid_device(device) || !valid_device(peerDevice)) return result(cudaErrorInvalidDevice);
  *canAccessPeer = device != peerDevice;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
  if (flags != 0) return result(cudaErrorInvalidValue);
  if (!valid_device(peerDevice)) return result(cudaErrorInvalidDevice);
  return cudaSuccess;
}

// ---- Memory ----------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  if (!devPtr) return result(cudaErrorInvalidValue);
  if (const cudaError_t rc = current_device_checked(); rc != cudaSuccess) return result(rc);
  *devPtr = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = emu::allocate(MemoryKind::device, size, t_device, nullptr);
  if (!p) return result(cudaErrorMemoryAllocation);
  *devPtr = p;
  return cudaSuccess;
}

/// Frees after the allocation's device has finished its queued work (cudaFree synchronises), so
/// that work still using the memory does not see it go.
cudaError_t cudaFree(void* devPtr) {
  if (!devPtr) return cudaSuccess;
  Allocation a;
  const std::string why = claim_for_free(devPtr, MemoryKind::device, &a);
  if (!why.empty()) return refuse(cudaErrorInvalidValue, "cudaFree: " + why);
  synchronize_device(a.device);
  std::memset(devPtr, poison_byte, a.size);
  release(devPtr);
  return result(sticky_of(a.device));
}

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  if (!pHost) return result(cudaErrorInvalidValue);
  (void)flags;  // portable, mapped, write-combined: all the same in host memory
  *pHost = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = emu::allocate(MemoryKind::pinned_host, size, valid_device(t_device) ? t_device : 0, nullptr);
  if (!p) return result(cudaErrorMemoryAllocation);
  *pHost = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void* ptr) {
  if (!ptr) return cudaSuccess;
  Allocation a;
  const std::string why = claim_for_free(ptr, MemoryKind::pinned_host, &a);
  if (!why.empty()) return refuse(cudaErrorInvalidValue, "cudaFreeHost: " + why);
  release(ptr);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (!attributes) return result(cudaErrorInvalidValue);
  std::memset(attributes, 0, sizeof *attributes);
  const PointerInfo info = find_pointer(ptr);
  switch (info.kind) {
    case MemoryKind::device:
      attributes->type = cudaMemoryTypeDevice;
      attributes->device = info.device;
      attributes->devicePointer = const_cast<void*>(ptr);
      break;
    case MemoryKind::pinned_host:
      attributes->type = cudaMemoryTypeHost;
      attributes->device = info.device;
      attributes->devicePointer = const_cast<void*>(ptr);  // mapped at the same address (UVA)
      attributes->hostPointer = const_cast<void*>(ptr);
      break;
    default:
      attributes->type = cudaMemoryTypeUnregistered;
      attributes->device = -2;
      break;
  }
  return cudaSuccess;
}

/// On the legacy stream, and the call returns when the copy is done, device to device included
/// (where CUDA may return earlier: waiting is one of the behaviours it allows).
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return result(copy("cudaMemcpy", dst, src, count, kind, nullptr, true));
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  return result(copy("cudaMemcpyAsync", dst, src, count, kind, stream, false));
}

/// Asynchronous on the legacy stream, as CUDA documents for device memory.
cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  return result(set("cudaMemset", devPtr, value, count, nullptr, false));
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  return result(set("cudaMemsetAsync", devPtr, value, count, stream, false));
}

/// Row by row: `height` rows of `width` bytes, `pitch` bytes apart, each set in stream order.
cudaError_t cudaMemset2DAsync(void* devPtr, size_t pitch, int value, size_t width, size_t height,
                              cudaStream_t stream) {
  if (height > 1 && width > pitch) return result(cudaErrorInvalidPitchValue);
  for (size_t row = 0; row < height; ++row)
    if (const cudaError_t e = set("cudaMemset2DAsync", static_cast<char*>(devPtr) + row * pitch, value, width, stream, false);
        e != cudaSuccess)
      return result(e);
  return cudaSuccess;
}

// ---- Stream-ordered pools --------------------------------------------------------------------
// A pool hands out host memory and gives it back when the stream reaches the free; it caches
// nothing, so its reserved memory is its used memory and the release threshold only is stored.

cudaError_t cudaMemPoolCreate(cudaMemPool_t* memPool, const cudaMemPoolProps* poolProps) {
  if (!memPool || !poolProps || poolProps->location.type != cudaMemLocationTypeDevice)
    return result(cudaErrorInvalidValue);
  if (!valid_device(poolProps->location.id)) return result(cudaErrorInvalidDevice);
  auto pool = std::make_shared<Pool>();
  pool->device = poolProps->location.id;
  {
    std::unique_lock lock(handles().m);
    handles().pools[pool.get()] = pool;
  }
  *memPool = reinterpret_cast<cudaMemPool_t>(pool.get());
  return cudaSuccess;
}

/// Outstanding allocations keep the pool's accounting alive until they are freed, as CUDA says.
cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool) {
  std::unique_lock lock(handles().m);
  if (handles().pools.erase(memPool) == 0) return result(cudaErrorInvalidValue);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* memPool, int device) {
  if (!memPool) return result(cudaErrorInvalidValue);
  if (!valid_device(device)) return result(cudaErrorInvalidDevice);
  auto pool = default_pool(device);
  {
    std::unique_lock lock(handles().m);
    handles().pools.emplace(pool.get(), pool);
  }
  *memPool = reinterpret_cast<cudaMemPool_t>(pool.get());
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, cudaMemPoolAttr attr, void* value) {
  const auto pool = find_pool(memPool);
  if (!pool || !value) return result(cudaErrorInvalidValue);
  std::lock_guard lock(pool->m);
  switch (attr) {
    case cudaMemPoolAttrReleaseThreshold:
      pool->release_threshold = *static_cast<std::uint64_t*>(value);
      break;
    case cudaMemPoolReuseFollowEventDependencies:
      pool->reuse_follow_events = *static_cast<int*>(value);
      break;
    case cudaMemPoolReuseAllowOpportunistic:
      pool->reuse_opportunistic = *static_cast<int*>(value);
      break;
    case cudaMemPoolReuseAllowInternalDependencies:
      pool->reuse_internal_dependencies = *static_cast<int*>(value);
      break;
    // The high-water marks may only be reset, to zero, which makes them the current figure.
    case cudaMemPoolAttrReservedMemHigh:
    case cudaMemPoolAttrUsedMemHigh:
      if (*static_cast<std::uint64_t*>(value) != 0) return result(cudaErrorInvalidValue);
      (attr == cudaMemPoolAttrUsedMemHigh ? pool->used_high : pool->reserved_high) = pool->used;
      break;
    default:
      return result(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, cudaMemPoolAttr attr, void* value) {
  const auto pool = find_pool(memPool);
  if (!pool || !value) return result(cudaErrorInvalidValue);
  std::lock_guard lock(pool->m);
  auto& v64 = *static_cast<std::uint64_t*>(value);
  switch (attr) {
    case cudaMemPoolAttrReleaseThreshold:
      v64 = pool->release_threshold;
      break;
    case cudaMemPoolAttrReservedMemCurrent:
      v64 = pool->used;
      break;
    case cudaMemPoolAttrReservedMemHigh:
      v64 = pool->reserved_high;
      break;
    case cudaMemPoolAttrUsedMemCurrent:
      v64 = pool->used;
      break;
    case cudaMemPoolAttrUsedMemHigh:
      v64 = pool->used_high;
      break;
    case cudaMemPoolReuseFollowEventDependencies:
      *static_cast<int*>(value) = pool->reuse_follow_events;
      break;
    case cudaMemPoolReuseAllowOpportunistic:
      *static_cast<int*>(value) = pool->reuse_opportunistic;
      break;
    case cudaMemPoolReuseAllowInternalDependencies:
      *static_cast<int*>(value) = pool->reuse_internal_dependencies;
      break;
    default:
      return result(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
  const auto pool = find_pool(memPool);
  if (!pool) return result(cudaErrorInvalidValue);
  return allocate_from_pool(ptr, size, pool, stream);
}

cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  const auto stream = find_stream(hStream);
  if (!stream) return result(cudaErrorInvalidResourceHandle);
  return allocate_from_pool(devPtr, size, default_pool(stream->device), hStream);
}

/// The block goes back when the stream reaches the free, poisoned first so that a read through a
/// stale pointer that the host allocator has not reused yet shows NaN.
cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  if (!devPtr) return cudaSuccess;
  const auto stream = find_stream(hStream);
  if (!stream) return result(cudaErrorInvalidResourceHandle);
  Allocation a;
  const std::string why = claim_for_free(devPtr, MemoryKind::device, &a);
  if (!why.empty()) return refuse(cudaErrorInvalidValue, "cudaFreeAsync: " + why);
  const std::size_t size = a.size;
  push(
      stream, "cudaFreeAsync",
      [devPtr, size] {
        std::memset(devPtr, poison_byte, size);
        release(devPtr);
      },
      {}, /*essential=*/true);
  return cudaSuccess;
}

// ---- Streams ---------------------------------------------------------------------------------

cudaError_t cudaStreamCreate(cudaStream_t* pStream) { return create_stream(pStream, cudaStreamDefault, 0); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  return create_stream(pStream, flags, 0);
}

/// Priorities are kept and reported; every stream has a worker of its own, so they order nothing.
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int flags, int priority) {
  return create_stream(pStream, flags, priority);
}

cudaError_t cudaStreamGetPriority(cudaStream_t hStream, int* priority) {
  const auto s = find_stream(hStream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  if (!priority) return result(cudaErrorInvalidValue);
  *priority = s->priority;
  return cudaSuccess;
}

cudaError_t cudaStreamGetId(cudaStream_t hStream, unsigned long long* streamId) {
  const auto s = find_stream(hStream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  if (!streamId) return result(cudaErrorInvalidValue);
  *streamId = s->id;
  return cudaSuccess;
}

cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int* flags) {
  const auto s = find_stream(hStream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  if (!flags) return result(cudaErrorInvalidValue);
  *flags = s->flags;
  return cudaSuccess;
}

/// Returns at once; the stream's queued work still runs, then its worker ends.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (is_default_stream(stream)) return result(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Stream> s;
  {
    std::unique_lock lock(handles().m);
    const auto it = handles().streams.find(stream);
    if (it == handles().streams.end()) return result(cudaErrorInvalidResourceHandle);
    s = std::move(it->second);
    handles().streams.erase(it);
    handles().free_stream_handles.insert(reinterpret_cast<std::uintptr_t>(stream));
  }
  close_stream(*s);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  const auto s = find_stream(stream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  synchronize(s);
  return result(sticky_of(s->device));
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  const auto s = find_stream(stream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  if (const cudaError_t sticky = sticky_of(s->device); sticky != cudaSuccess) return result(sticky);
  std::lock_guard lock(s->m);
  return s->completed == s->enqueued ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  const auto s = find_stream(stream);
  const auto e = find_event(event);
  if (!s || !e) return result(cudaErrorInvalidResourceHandle);
  (void)flags;  // cudaEventWaitDefault; the external-wait flag only matters for graphs
  Dependency dep;
  {
    std::lock_guard lock(e->m);
    if (!e->stream) return cudaSuccess;  // never recorded: nothing to wait for, as in CUDA
    dep = {e->stream, e->position};
  }
  {
    std::lock_guard lock(dep.stream->m);
    if (dep.stream->completed >= dep.position) return cudaSuccess;
  }
  push(
      s, "cudaStreamWaitEvent", [] {}, {std::move(dep)}, /*essential=*/true);
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  const auto s = find_stream(stream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  if (!fn) return result(cudaErrorInvalidValue);
  push(s, "cudaLaunchHostFunc", [fn, userData] { fn(userData); });
  return cudaSuccess;
}

// ---- Events ----------------------------------------------------------------------------------

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  constexpr unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (!event || (flags & ~known) != 0) return result(cudaErrorInvalidValue);
  if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)) return result(cudaErrorInvalidValue);
  auto e = std::make_shared<Event>();
  e->flags = flags;
  {
    std::unique_lock lock(handles().m);
    handles().events[e.get()] = e;
  }
  *event = reinterpret_cast<cudaEvent_t>(e.get());
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

/// Returns at once; waits already made on the event still see the position recorded before.
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::unique_lock lock(handles().m);
  if (handles().events.erase(event) == 0) return result(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

/// Captures the stream's position; the host time is taken when the stream gets there.
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  const auto e = find_event(event);
  const auto s = find_stream(stream);
  if (!e || !s) return result(cudaErrorInvalidResourceHandle);
  std::uint64_t generation = 0;
  {
    std::lock_guard lock(e->m);
    generation = ++e->generation;
    e->timed = false;
  }
  // The lock is not held across push: in synchronous mode the marker runs inside it.
  const std::uint64_t position = push(
      s, "cudaEventRecord",
      [e, generation] {
        std::lock_guard lock(e->m);
        if (e->generation != generation) return;  // recorded again since
        e->time = Clock::now();
        e->timed = true;
      },
      {}, /*essential=*/true);
  std::lock_guard lock(e->m);
  if (e->generation == generation) {
    e->stream = s;
    e->position = position;
  }
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  const auto e = find_event(event);
  if (!e) return result(cudaErrorInvalidResourceHandle);
  Dependency dep;
  {
    std::lock_guard lock(e->m);
    if (!e->stream) return cudaSuccess;
    dep = {e->stream, e->position};
  }
  if (const cudaError_t sticky = sticky_of(dep.stream->device); sticky != cudaSuccess) return result(sticky);
  std::lock_guard lock(dep.stream->m);
  return dep.stream->completed >= dep.position ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  const auto e = find_event(event);
  if (!e) return result(cudaErrorInvalidResourceHandle);
  Dependency dep;
  {
    std::lock_guard lock(e->m);
    if (!e->stream) return cudaSuccess;
    dep = {e->stream, e->position};
  }
  wait_reached(*dep.stream, dep.position);
  return result(sticky_of(dep.stream->device));
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return result(cudaErrorInvalidValue);
  const auto a = find_event(start);
  const auto b = find_event(end);
  if (!a || !b) return result(cudaErrorInvalidResourceHandle);
  if ((a->flags | b->flags) & cudaEventDisableTiming) return result(cudaErrorInvalidResourceHandle);
  for (const auto& e : {a, b}) {
    std::lock_guard lock(e->m);
    if (!e->stream) return result(cudaErrorInvalidResourceHandle);
  }
  for (cudaEvent_t e : {start, end})
    if (const cudaError_t rc = cudaEventQuery(e); rc != cudaSuccess) return result(rc);
  Clock::time_point t0, t1;
  for (const auto& [e, t] : {std::pair{a, &t0}, std::pair{b, &t1}}) {
    std::lock_guard lock(e->m);
    if (!e->timed) return result(cudaErrorNotReady);  // recorded again meanwhile
    *t = e->time;
  }
  *ms = std::chrono::duration<float, std::milli>(t1 - t0).count();
  return cudaSuccess;
}

}  // extern "C"
