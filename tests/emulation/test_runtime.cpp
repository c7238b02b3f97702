// Tests of the emulated CUDA runtime: memory, copies, streams, events, pools and errors behave as
// the CUDA Runtime API documents. Work is enqueued as host lambdas through runtime.hpp, so that
// ordering is tested without the kernel emulator; sleeps make the race windows real.
#include <cuda_runtime_api.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "polyshard/emulation/runtime.hpp"

using namespace polyshard::emulation;
using namespace std::chrono_literals;

namespace {

/// A stream of the current device, destroyed at scope end.
struct TestStream {
  cudaStream_t s = nullptr;
  explicit TestStream(unsigned flags = cudaStreamNonBlocking) {
    REQUIRE(cudaStreamCreateWithFlags(&s, flags) == cudaSuccess);
  }
  ~TestStream() { cudaStreamDestroy(s); }
  operator cudaStream_t() const { return s; }
};

/// Device memory of the current device, freed at scope end.
template <class T>
struct DeviceArray {
  T* p = nullptr;
  std::size_t n;
  explicit DeviceArray(std::size_t count) : n(count) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)) == cudaSuccess);
  }
  ~DeviceArray() { cudaFree(p); }
  std::vector<T> download() const {
    std::vector<T> v(n);
    REQUIRE(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return v;
  }
};

/// Blocks `stream` for `d`, so that what is enqueued after it is still pending for a while. Only
/// for work that takes time (elapsed times, work that ends while the host goes on): a check that
/// work is still pending holds it with a Gate instead, which no load on the machine can open.
void stall(cudaStream_t stream, std::chrono::milliseconds d) {
  enqueue(stream, "stall", [d] { std::this_thread::sleep_for(d); });
}

/// Holds the streams it is put on until the test releases it: what is enqueued behind it is
/// pending for certain, however slow the machine. Released at the latest when it goes out of
/// scope (the held work shares the flag, so it may outlive the gate).
struct Gate {
  std::shared_ptr<std::atomic<bool>> open = std::make_shared<std::atomic<bool>>(false);
  void hold(cudaStream_t stream) {
    enqueue(stream, "gate", [flag = open] { flag->wait(false); });
  }
  void release() {
    *open = true;
    open->notify_all();
  }
  Gate() = default;
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  ~Gate() { release(); }
};

bool all_nan(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isnan(x)) return false;
  return true;
}

}  // namespace

TEST_CASE("the emulated devices look like Hopper GPUs", "[emulation][runtime]") {
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  const char* env = std::getenv("POLYSHARD_EMULATION_DEVICES");
  CHECK(count == (env ? std::atoi(env) : 4));
  REQUIRE(count >= 4);  // the tests below use devices 0..3
  cudaDeviceProp p{};
  REQUIRE(cudaGetDeviceProperties(&p, 1) == cudaSuccess);
  // polyshard::cuda::device_description appends "(sm_90)" from major and minor.
  CHECK(std::string(p.name) == "polyshard emulated CUDA device");
  CHECK(p.major == 9);
  CHECK(p.minor == 0);
  CHECK(p.warpSize == 32);
  CHECK(p.maxThreadsPerBlock == 1024);
  CHECK(p.totalGlobalMem == std::size_t{80} << 30);
  int value = 0;
  REQUIRE(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
  CHECK(value == p.multiProcessorCount);
  REQUIRE(cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
  CHECK(value == 9);
  CHECK(cudaGetDeviceProperties(&p, count) == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  int least = 1, greatest = 1;
  REQUIRE(cudaDeviceGetStreamPriorityRange(&least, &greatest) == cudaSuccess);
  CHECK(least == 0);
  CHECK(greatest < 0);
}

TEST_CASE("the current device is per host thread", "[emulation][runtime]") {
  REQUIRE(cudaSetDevice(2) == cudaSuccess);
  int other = -1;
  std::thread([&] { cudaGetDevice(&other); }).join();
  CHECK(other == 0);
  int mine = -1;
  REQUIRE(cudaGetDevice(&mine) == cudaSuccess);
  CHECK(mine == 2);
  CHECK(cudaSetDevice(99) == cudaErrorInvalidDevice);
  REQUIRE(cudaGetDevice(&mine) == cudaSuccess);
  CHECK(mine == 2);
  cudaGetLastError();
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}

TEST_CASE("fresh device memory reads as NaN", "[emulation][runtime]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  DeviceArray<float> a(1000);
  CHECK(all_nan(a.download()));

  TestStream stream;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool = nullptr;
  REQUIRE(cudaMemPoolCreate(&pool, &props) == cudaSuccess);
  void* p = nullptr;
  REQUIRE(cudaMallocFromPoolAsync(&p, 4096 * sizeof(double), pool, stream) == cudaSuccess);
  std::vector<double> d(4096, 1.0);
  REQUIRE(cudaMemcpyAsync(d.data(), p, d.size() * sizeof(double), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  for (double x : d) REQUIRE(std::isnan(x));
  REQUIRE(cudaFreeAsync(p, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  REQUIRE(cudaMemPoolDestroy(pool) == cudaSuccess);
}

TEST_CASE("allocations belong to the device that was current", "[emulation][runtime]") {
  for (int device : {1, 3}) {
    REQUIRE(cudaSetDevice(device) == cudaSuccess);
    DeviceArray<int> a(100);
    const PointerInfo info = find_pointer(a.p + 50);
    CHECK(info.kind == MemoryKind::device);
    CHECK(info.device == device);
    CHECK(info.base == a.p);
    CHECK(info.size == 400);
    cudaPointerAttributes attributes{};
    REQUIRE(cudaPointerGetAttributes(&attributes, a.p) == cudaSuccess);
    CHECK(attributes.type == cudaMemoryTypeDevice);
    CHECK(attributes.device == device);
    CHECK(find_pointer(a.p + 100).kind != MemoryKind::device);  // one past the end is not inside
  }
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}

TEST_CASE("freeing what is not a live allocation is an invalid value", "[emulation][runtime]") {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, 64) == cudaSuccess);
  REQUIRE(cudaFree(p) == cudaSuccess);
  CHECK(find_pointer(p).kind == MemoryKind::unknown);
  CHECK(cudaFree(p) == cudaErrorInvalidValue);
  CHECK_THAT(last_fault_message(), Catch::Contains("cudaFree") && Catch::Contains("not a live device allocation"));
  int on_stack = 0;
  CHECK(cudaFree(&on_stack) == cudaErrorInvalidValue);
  CHECK(cudaFreeHost(&on_stack) == cudaErrorInvalidValue);
  CHECK(cudaFree(nullptr) == cudaSuccess);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("pinned host memory is found by cudaPointerGetAttributes", "[emulation][runtime]") {
  void* pinned = nullptr;
  REQUIRE(cudaHostAlloc(&pinned, 10000, cudaHostAllocPortable) == cudaSuccess);
  void* also = nullptr;
  REQUIRE(cudaMallocHost(&also, 100) == cudaSuccess);
  std::vector<char> pageable(100);
  cudaPointerAttributes attributes{};
  REQUIRE(cudaPointerGetAttributes(&attributes, static_cast<char*>(pinned) + 9999) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeHost);
  CHECK(attributes.hostPointer == static_cast<char*>(pinned) + 9999);
  REQUIRE(cudaPointerGetAttributes(&attributes, also) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeHost);
  REQUIRE(cudaPointerGetAttributes(&attributes, pageable.data()) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeUnregistered);
  CHECK(find_pointer(pinned).kind == MemoryKind::pinned_host);
  CHECK(reinterpret_cast<std::uintptr_t>(pinned) % 4096 == 0);
  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
  REQUIRE(cudaFreeHost(also) == cudaSuccess);
  CHECK(find_pointer(pinned).kind == MemoryKind::unknown);
}

TEST_CASE("copies run in every direction and check their ranges", "[emulation][runtime]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  std::vector<float> host(256);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f;
  DeviceArray<float> a(256), b(256);
  REQUIRE(cudaMemcpy(a.p, host.data(), 1024, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(b.p, a.p, 1024, cudaMemcpyDeviceToDevice) == cudaSuccess);
  CHECK(b.download() == host);

  SECTION("between devices, directions inferred (cudaMemcpyDefault)") {
    REQUIRE(cudaSetDevice(2) == cudaSuccess);
    DeviceArray<float> c(256);
    REQUIRE(cudaMemcpy(c.p, b.p, 1024, cudaMemcpyDefault) == cudaSuccess);
    std::vector<float> back(256, 0.0f);
    REQUIRE(cudaMemcpy(back.data(), c.p, 1024, cudaMemcpyDefault) == cudaSuccess);
    CHECK(back == host);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
  }
  SECTION("set") {
    REQUIRE(cudaMemset(b.p, 0, 1024) == cudaSuccess);
    CHECK(b.download() == std::vector<float>(256, 0.0f));
    TestStream stream;
    REQUIRE(cudaMemsetAsync(b.p + 128, 0xFF, 512, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    const auto v = b.download();
    CHECK(v[127] == 0.0f);
    CHECK(std::isnan(v[128]));
  }
  SECTION("a range past the end of an allocation is refused with a message") {
    CHECK(cudaMemcpy(a.p + 1, host.data(), 1024, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    CHECK_THAT(last_fault_message(), Catch::Contains("past the end") && Catch::Contains("1024 bytes"));
    CHECK(cudaMemsetAsync(a.p, 0, 1025, nullptr) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  }
  SECTION("a host pointer where device memory is due is refused") {
    std::vector<float> other(256);
    CHECK(cudaMemcpy(other.data(), host.data(), 1024, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    CHECK_THAT(last_fault_message(), Catch::Contains("not in a live device allocation"));
    CHECK(cudaMemcpy(a.p, b.p, 1024, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    CHECK(cudaMemcpy(a.p, b.p, 1024, static_cast<cudaMemcpyKind>(17)) == cudaErrorInvalidMemcpyDirection);
    cudaGetLastError();
  }
}

TEST_CASE("copies from and to pageable memory follow CUDA's staging rules", "[emulation][runtime]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  TestStream stream;
  DeviceArray<int> a(1024);

  SECTION("host to device: the source is taken before the call returns") {
    std::vector<int> source(1024, 7);
    stall(stream, 100ms);
    REQUIRE(cudaMemcpyAsync(a.p, source.data(), 4096, cudaMemcpyHostToDevice, stream) == cudaSuccess);
    std::fill(source.begin(), source.end(), -1);  // while the copy is still queued
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(a.download() == std::vector<int>(1024, 7));
  }
  SECTION("device to host: the call returns once the data is there") {
    REQUIRE(cudaMemsetAsync(a.p, 0, 4096, stream) == cudaSuccess);
    std::vector<int> out(1024, 5);
    stall(stream, 100ms);
    REQUIRE(cudaMemcpyAsync(out.data(), a.p, 4096, cudaMemcpyDeviceToHost, stream) == cudaSuccess);
    CHECK(out == std::vector<int>(1024, 0));
    CHECK(cudaStreamQuery(stream) == cudaSuccess);
  }
  SECTION("pinned memory: truly asynchronous") {
    REQUIRE(cudaMemsetAsync(a.p, 0, 4096, stream) == cudaSuccess);
    int* pinned = nullptr;
    REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), 4096) == cudaSuccess);
    Gate gate;
    gate.hold(stream);
    // Returns while the stream is held (a copy that waited for the stream would never return).
    REQUIRE(cudaMemcpyAsync(pinned, a.p, 4096, cudaMemcpyDeviceToHost, stream) == cudaSuccess);
    CHECK(cudaStreamQuery(stream) == cudaErrorNotReady);
    gate.release();
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(pinned[0] == 0);
    CHECK(pinned[1023] == 0);
    REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
  }
}

TEST_CASE("an event orders one stream's work after another's", "[emulation][runtime]") {
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  TestStream producer, consumer;
  cudaEvent_t done = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess);
  const bool ordered = GENERATE(true, false);
  INFO((ordered ? "with" : "without") << " cudaStreamWaitEvent");

  std::atomic<bool> written{false};
  std::atomic<int> seen{-1};
  DeviceArray<float> data(1 << 16), copy(1 << 16);
  Gate gate;  // the writer writes once the consumer is done, unless an event orders them
  if (ordered) gate.release();
  gate.hold(producer);
  enqueue(producer, "writer", [&] {
    std::fill(data.p, data.p + data.n, 3.0f);
    written = true;
  });
  REQUIRE(cudaEventRecord(done, producer) == cudaSuccess);
  if (ordered) REQUIRE(cudaStreamWaitEvent(consumer, done, 0) == cudaSuccess);
  enqueue(consumer, "reader", [&] { seen = written.load() ? 1 : 0; });
  if (ordered)
    REQUIRE(cudaMemcpyAsync(copy.p, data.p, data.n * sizeof(float), cudaMemcpyDeviceToDevice, consumer) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(consumer) == cudaSuccess);
  CHECK(seen.load() == (ordered ? 1 : 0));
  if (ordered) CHECK(copy.download() == std::vector<float>(data.n, 3.0f));
  if (!ordered) CHECK(cudaEventQuery(done) == cudaErrorNotReady);
  gate.release();
  REQUIRE(cudaEventSynchronize(done) == cudaSuccess);
  CHECK(cudaEventQuery(done) == cudaSuccess);
  REQUIRE(cudaEventDestroy(done) == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}

TEST_CASE("an event never recorded is complete and orders nothing", "[emulation][runtime]") {
  TestStream stream;
  cudaEvent_t e = nullptr;
  REQUIRE(cudaEventCreate(&e) == cudaSuccess);
  CHECK(cudaEventQuery(e) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(stream, e, 0) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  CHECK(cudaEventDestroy(e) == cudaErrorInvalidResourceHandle);
  CHECK(cudaEventQuery(e) == cudaErrorInvalidResourceHandle);
  cudaGetLastError();
}

TEST_CASE("the legacy default stream is ordered with blocking streams only", "[emulation][runtime]") {
  REQUIRE(cudaSetDevice(2) == cudaSuccess);
  TestStream blocking(cudaStreamDefault), non_blocking(cudaStreamNonBlocking);
  std::atomic<bool> on_blocking{false}, on_non_blocking{false};
  std::atomic<int> legacy_saw_blocking{-1}, legacy_saw_non_blocking{-1};

  SECTION("legacy work waits for earlier work of blocking streams") {
    Gate gate;  // holds the non-blocking stream's work until the legacy stream's is done
    enqueue(blocking, "slow", [&] {
      std::this_thread::sleep_for(100ms);
      on_blocking = true;
    });
    gate.hold(non_blocking);
    enqueue(non_blocking, "held", [&] { on_non_blocking = true; });
    enqueue(cudaStreamLegacy, "reader", [&] {
      legacy_saw_blocking = on_blocking.load();
      legacy_saw_non_blocking = on_non_blocking.load();
    });
    REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
    CHECK(legacy_saw_blocking.load() == 1);
    CHECK(legacy_saw_non_blocking.load() == 0);
    gate.release();
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(on_non_blocking.load());
  }
  SECTION("blocking streams' later work waits for the legacy stream") {
    std::atomic<bool> on_legacy{false};
    std::atomic<int> blocking_saw{-1}, non_blocking_saw{-1};
    Gate gate;  // holds the legacy stream until the non-blocking stream's reader is done
    gate.hold(nullptr);
    enqueue(nullptr, "held", [&] { on_legacy = true; });
    enqueue(blocking, "reader", [&] { blocking_saw = on_legacy.load(); });
    enqueue(non_blocking, "reader", [&] { non_blocking_saw = on_legacy.load(); });
    REQUIRE(cudaStreamSynchronize(non_blocking) == cudaSuccess);
    CHECK(non_blocking_saw.load() == 0);
    gate.release();
    REQUIRE(cudaStreamSynchronize(blocking) == cudaSuccess);
    CHECK(blocking_saw.load() == 1);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}

TEST_CASE("each host thread has a default stream of its own", "[emulation][runtime]") {
  // CUDA gives every host thread its own cudaStreamPerThread: what one thread holds there does
  // not hold another thread's, as the shared legacy stream would. The other thread's work must
  // finish while this thread's is held; its wait is bounded so that a shared stream fails the
  // check instead of hanging.
  Gate gate;
  gate.hold(cudaStreamPerThread);
  std::atomic<bool> held_ran{false};
  enqueue(cudaStreamPerThread, "held", [&] { held_ran = true; });
  std::atomic<bool> other_ran{false};
  cudaError_t other_state = cudaErrorNotReady;
  std::thread other([&] {
    enqueue(cudaStreamPerThread, "other thread's", [&] { other_ran = true; });
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while ((other_state = cudaStreamQuery(cudaStreamPerThread)) == cudaErrorNotReady &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
  });
  other.join();
  CHECK(other_state == cudaSuccess);
  CHECK(other_ran.load());
  CHECK_FALSE(held_ran.load());
  CHECK(cudaStreamQuery(cudaStreamPerThread) == cudaErrorNotReady);
  gate.release();
  REQUIRE(cudaStreamSynchronize(cudaStreamPerThread) == cudaSuccess);
  CHECK(held_ran.load());
}

TEST_CASE("a thread's default stream is ordered with the legacy stream", "[emulation][runtime]") {
  // It is a blocking stream: legacy work waits for it, and its later work for the legacy stream.
  Gate gate;
  gate.hold(cudaStreamPerThread);
  std::atomic<bool> on_per_thread{false};
  std::atomic<int> legacy_saw{-1};
  enqueue(cudaStreamPerThread, "held", [&] { on_per_thread = true; });
  enqueue(cudaStreamLegacy, "reader", [&] { legacy_saw = on_per_thread.load(); });
  CHECK(cudaStreamQuery(cudaStreamLegacy) == cudaErrorNotReady);
  gate.release();
  REQUIRE(cudaStreamSynchronize(cudaStreamLegacy) == cudaSuccess);
  CHECK(legacy_saw.load() == 1);
}

TEST_CASE("event elapsed time is the host time between the records", "[emulation][runtime]") {
  TestStream stream;
  cudaEvent_t start = nullptr, stop = nullptr, untimed = nullptr, unrecorded = nullptr;
  REQUIRE(cudaEventCreate(&start) == cudaSuccess);
  REQUIRE(cudaEventCreate(&stop) == cudaSuccess);
  REQUIRE(cudaEventCreate(&unrecorded) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming) == cudaSuccess);
  Gate gate;
  REQUIRE(cudaEventRecord(start, stream) == cudaSuccess);
  gate.hold(stream);
  stall(stream, 60ms);
  REQUIRE(cudaEventRecord(stop, stream) == cudaSuccess);
  REQUIRE(cudaEventRecord(untimed, stream) == cudaSuccess);
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop) == cudaErrorNotReady);
  gate.release();
  REQUIRE(cudaEventSynchronize(stop) == cudaSuccess);
  REQUIRE(cudaEventElapsedTime(&ms, start, stop) == cudaSuccess);
  CHECK(ms >= 55.0f);
  CHECK(ms < 5000.0f);
  CHECK(cudaEventElapsedTime(&ms, start, untimed) == cudaErrorInvalidResourceHandle);
  CHECK(cudaEventElapsedTime(&ms, start, unrecorded) == cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  for (cudaEvent_t e : {start, stop, untimed, unrecorded}) REQUIRE(cudaEventDestroy(e) == cudaSuccess);
}

TEST_CASE("a fault in enqueued work becomes the device's sticky error", "[emulation][runtime]") {
  REQUIRE(cudaSetDevice(3) == cudaSuccess);
  TestStream stream, other;
  cudaEvent_t event = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess);
  std::atomic<bool> later_ran{false};
  const bool as_device_fault = GENERATE(true, false);
  if (as_device_fault)
    enqueue(stream, "kernel broken_kernel", [] {
      throw DeviceFault{cudaErrorIllegalAddress, "kernel broken_kernel: thread (3, 0, 0) read past its buffer"};
    });
  else
    enqueue(stream, "kernel throwing_kernel", [] { throw std::runtime_error("out of range"); });
  enqueue(stream, "later", [&] { later_ran = true; });
  REQUIRE(cudaEventRecord(event, stream) == cudaSuccess);

  const cudaError_t expected = as_device_fault ? cudaErrorIllegalAddress : cudaErrorLaunchFailure;
  CHECK(cudaStreamSynchronize(stream) == expected);
  CHECK_FALSE(later_ran.load());
  CHECK_THAT(last_fault_message(),
             as_device_fault ? Catch::Contains("broken_kernel") : Catch::Contains("throwing_kernel: out of range"));
  CHECK(cudaStreamSynchronize(other) == expected);  // every stream of the device
  CHECK(cudaDeviceSynchronize() == expected);
  CHECK(cudaEventSynchronize(event) == expected);
  CHECK(cudaEventQuery(event) == expected);
  CHECK(cudaStreamQuery(stream) == expected);
  DeviceArray<float> a(4);
  float x[4];
  CHECK(cudaMemcpy(x, a.p, sizeof x, cudaMemcpyDeviceToHost) == expected);
  CHECK(cudaGetLastError() == expected);  // sticky: not cleared
  CHECK(cudaGetLastError() == expected);

  // Other devices are untouched.
  REQUIRE(cudaSetDevice(2) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);

  REQUIRE(cudaSetDevice(3) == cudaSuccess);
  REQUIRE(cudaEventDestroy(event) == cudaSuccess);
  CHECK(cudaDeviceReset() == cudaSuccess);  // the emulation's reset clears the sticky error
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}

TEST_CASE("cudaGetLastError returns a refused launch once", "[emulation][runtime]") {
  CHECK(cudaGetLastError() == cudaSuccess);
  report_launch_error(cudaErrorInvalidConfiguration, "kernel wide_kernel: block (2048, 1, 1) has 2048 threads");
  CHECK_THAT(last_fault_message(), Catch::Contains("wide_kernel"));
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);
  std::thread([] { report_launch_error(cudaErrorInvalidValue, "another thread's"); }).join();
  CHECK(cudaGetLastError() == cudaSuccess);  // per thread
  CHECK(std::string(cudaGetErrorName(cudaErrorInvalidConfiguration)) == "cudaErrorInvalidConfiguration");
  CHECK(std::string(cudaGetErrorString(cudaErrorInvalidConfiguration)) == "invalid configuration argument");
  CHECK(std::string(cudaGetErrorString(cudaErrorNotReady)) == "device not ready");
  CHECK(std::string(cudaGetErrorName(cudaSuccess)) == "cudaSuccess");
  CHECK(std::string(cudaGetErrorName(cudaErrorIllegalAddress)) == "cudaErrorIllegalAddress");
}

TEST_CASE("cudaFuncSetAttribute raises a kernel's dynamic shared memory on the current device only",
          "[emulation][runtime]") {
  static const int stand_in = 0;  // any address names a kernel here
  const void* kernel = &stand_in;
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  CHECK(dynamic_shared_limit(kernel) == 48 * 1024);
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000) == cudaSuccess);
  CHECK(dynamic_shared_limit(kernel) == 100000);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  CHECK(dynamic_shared_limit(kernel) == 48 * 1024);  // a GPU keeps the limit per device
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024) == cudaSuccess);
  CHECK(dynamic_shared_limit(kernel) == 227 * 1024);
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 + 1) ==
        cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(dynamic_shared_limit(kernel) == 227 * 1024);
  CHECK(cudaFuncSetAttribute(nullptr, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024) ==
        cudaErrorInvalidDeviceFunction);
  CHECK(cudaGetLastError() == cudaErrorInvalidDeviceFunction);
}

TEST_CASE("stream-ordered frees happen when the stream gets there", "[emulation][runtime]") {
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  TestStream stream;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 1;
  cudaMemPool_t pool = nullptr;
  REQUIRE(cudaMemPoolCreate(&pool, &props) == cudaSuccess);
  std::uint64_t threshold = ~std::uint64_t{0}, v = 0;
  REQUIRE(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold) == cudaSuccess);
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &v) == cudaSuccess);
  CHECK(v == threshold);

  void* p = nullptr;
  REQUIRE(cudaMallocFromPoolAsync(&p, 1000, pool, stream) == cudaSuccess);
  CHECK(find_pointer(p).device == 1);
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &v) == cudaSuccess);
  CHECK(v == 1000);
  Gate gate;
  gate.hold(stream);
  REQUIRE(cudaFreeAsync(p, stream) == cudaSuccess);
  CHECK(cudaFreeAsync(p, stream) == cudaErrorInvalidValue);  // already on its way out
  CHECK(find_pointer(p).kind == MemoryKind::device);         // the stream has not got there
  gate.release();
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(find_pointer(p).kind == MemoryKind::unknown);
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &v) == cudaSuccess);
  CHECK(v == 0);
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &v) == cudaSuccess);
  CHECK(v == 1000);
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v) == cudaSuccess);
  CHECK(v == 0);
  cudaGetLastError();
  REQUIRE(cudaMemPoolDestroy(pool) == cudaSuccess);
  CHECK(cudaMemPoolDestroy(pool) == cudaErrorInvalidValue);
  cudaGetLastError();
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}

TEST_CASE("streams report their priority and state", "[emulation][runtime]") {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, -3) == cudaSuccess);
  int priority = 0;
  unsigned flags = 0;
  REQUIRE(cudaStreamGetPriority(s, &priority) == cudaSuccess);
  REQUIRE(cudaStreamGetFlags(s, &flags) == cudaSuccess);
  CHECK(priority == -3);
  CHECK(flags == cudaStreamNonBlocking);
  std::atomic<int> calls{0};
  Gate gate;
  gate.hold(s);
  REQUIRE(cudaLaunchHostFunc(
              s, [](void* c) { ++*static_cast<std::atomic<int>*>(c); }, &calls) == cudaSuccess);
  CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
  gate.release();
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(calls.load() == 1);
  CHECK(cudaStreamQuery(s) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cudaStreamDestroy(s) == cudaErrorInvalidResourceHandle);
  CHECK(cudaStreamSynchronize(s) == cudaErrorInvalidResourceHandle);
  cudaGetLastError();
}

TEST_CASE("a destroyed stream still runs what was queued", "[emulation][runtime]") {
  std::atomic<bool> ran{false};
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
  stall(s, 50ms);
  enqueue(s, "after destroy", [&] { ran = true; });
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the device still waits for it
  CHECK(ran.load());
}

TEST_CASE("many host threads use the runtime at once", "[emulation][runtime]") {
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([t, &failures] {
      cudaSetDevice(t % 4);
      cudaStream_t s = nullptr;
      cudaEvent_t e = nullptr;
      if (cudaStreamCreateWithFlags(&s, t % 2 ? cudaStreamNonBlocking : cudaStreamDefault) != cudaSuccess ||
          cudaEventCreate(&e) != cudaSuccess)
        ++failures;
      std::vector<int> host(4096, t), back(4096);
      int* d = nullptr;
      if (cudaMallocAsync(reinterpret_cast<void**>(&d), 4096 * sizeof(int), s) != cudaSuccess) ++failures;
      for (int i = 0; i < 50; ++i) {
        host[0] = i;
        cudaMemcpyAsync(d, host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice, s);
        cudaEventRecord(e, s);
        cudaStreamWaitEvent(nullptr, e, 0);
        cudaMemcpyAsync(back.data(), d, back.size() * sizeof(int), cudaMemcpyDeviceToHost, s);
        if (back[0] != i || back[4095] != t) ++failures;
      }
      cudaFreeAsync(d, s);
      if (cudaStreamSynchronize(s) != cudaSuccess) ++failures;
      cudaEventDestroy(e);
      cudaStreamDestroy(s);
    });
  for (auto& t : threads) t.join();
  CHECK(failures.load() == 0);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("synchronous mode runs work when it is enqueued", "[emulation][runtime]") {
  if (synchronous_mode()) {
    SUCCEED("this process runs in synchronous mode: [sync-mode] checks it");
    return;
  }
  // The mode is read once per process: run this binary's [sync-mode] test in a child.
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string command = "POLYSHARD_EMULATION_SYNC=1 '" + self + "' '[sync-mode]' > /dev/null 2>&1";
  CHECK(std::system(command.c_str()) == 0);
}

TEST_CASE("synchronous mode: work runs on the calling thread", "[.][sync-mode]") {
  REQUIRE(synchronous_mode());
  TestStream stream;
  std::thread::id ran_on;
  enqueue(stream, "inline", [&] { ran_on = std::this_thread::get_id(); });
  CHECK(ran_on == std::this_thread::get_id());
  CHECK(cudaStreamQuery(stream) == cudaSuccess);
  cudaEvent_t start = nullptr, stop = nullptr;
  REQUIRE(cudaEventCreate(&start) == cudaSuccess);
  REQUIRE(cudaEventCreate(&stop) == cudaSuccess);
  REQUIRE(cudaEventRecord(start, stream) == cudaSuccess);
  stall(stream, 20ms);
  REQUIRE(cudaEventRecord(stop, stream) == cudaSuccess);
  CHECK(cudaEventQuery(stop) == cudaSuccess);
  float ms = 0;
  REQUIRE(cudaEventElapsedTime(&ms, start, stop) == cudaSuccess);
  CHECK(ms >= 15.0f);
  REQUIRE(cudaSetDevice(3) == cudaSuccess);
  enqueue(nullptr, "fault", [] { throw DeviceFault{cudaErrorAssert, "kernel asserting_kernel: assert"}; });
  CHECK(cudaPeekAtLastError() == cudaErrorAssert);  // already happened
  CHECK(cudaDeviceSynchronize() == cudaErrorAssert);
  CHECK(cudaDeviceReset() == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaEventDestroy(start) == cudaSuccess);
  REQUIRE(cudaEventDestroy(stop) == cudaSuccess);
}

TEST_CASE("a program may exit with streams and work still alive", "[emulation][runtime]") {
  cudaStream_t leaked = nullptr;
  REQUIRE(cudaStreamCreate(&leaked) == cudaSuccess);
  stall(leaked, 10ms);
  SUCCEED("the stream is never destroyed: the process must still exit cleanly");
}
