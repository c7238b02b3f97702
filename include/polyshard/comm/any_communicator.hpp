// A communicator of host buffers chosen at run time: any backend behind one type, so that code
// generic over the communicator (an Engine, a training loop) is compiled once for all of them.
#pragma once

#include <chrono>
#include <concepts>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

#include "polyshard/comm/communicator.hpp"
#include "polyshard/comm/host_values.hpp"

namespace polyshard {

/// Wraps a Communicator of host buffers (ThreadCommunicator, MpiCommunicator, one of your own)
/// and is one itself: every collective forwards, by one virtual call, to the wrapped backend,
/// which counts its traffic and enforces its timeout as before.
///
/// What it buys is compile time: an `Engine<S, Model, AnyCommunicator, Opt>` serves ranks that
/// are threads and ranks that are MPI processes with one instantiation, where naming each
/// backend instantiates the whole engine once per backend. A virtual call per collective costs
/// nothing beside a collective. NCCL (device buffers) stays with its own type.
///
///   AnyCommunicator::borrow(comm)   wraps a communicator that outlives the wrapper (run_ranks'
///                                   ThreadCommunicator&, the MpiCommunicator of main())
///   AnyCommunicator(std::move(c))   owns it; split() returns wrappers that own the sub-groups
class AnyCommunicator {
 public:
  template <Communicator C>
    requires(!std::same_as<std::remove_cvref_t<C>, AnyCommunicator> && !std::is_lvalue_reference_v<C>)
  explicit AnyCommunicator(C&& comm) : self_(std::make_unique<Owned<C>>(std::move(comm))) {
    static_assert(!moves_device_buffers<C>, "AnyCommunicator wraps communicators of host buffers only");
  }

  /// Wraps `comm` without owning it: `comm` must outlive the wrapper and what it splits off.
  template <Communicator C>
  static AnyCommunicator borrow(C& comm) {
    static_assert(!moves_device_buffers<C>, "AnyCommunicator wraps communicators of host buffers only");
    return AnyCommunicator(std::make_unique<Borrowed<C>>(comm));
  }

  AnyCommunicator(AnyCommunicator&&) noexcept = default;
  AnyCommunicator& operator=(AnyCommunicator&&) noexcept = default;

  int rank() const { return self_->rank(); }
  int size() const { return self_->size(); }

  template <FloatElement T>
  void all_reduce(std::span<T> buf, ReduceOp op = ReduceOp::Sum) {
    self_->all_reduce(erase(buf), op, false);
  }
  template <FloatElement T>
  CommHandle all_reduce_async(std::span<T> buf, ReduceOp op = ReduceOp::Sum) {
    return self_->all_reduce(erase(buf), op, true);
  }
  template <FloatElement T>
  void reduce_scatter(std::type_identity_t<std::span<const T>> in, std::span<T> out, ReduceOp op = ReduceOp::Sum) {
    self_->reduce_scatter(erase(in), erase(out), op, false);
  }
  template <FloatElement T>
  CommHandle reduce_scatter_async(std::type_identity_t<std::span<const T>> in, std::span<T> out,
                                  ReduceOp op = ReduceOp::Sum) {
    return self_->reduce_scatter(erase(in), erase(out), op, true);
  }
  template <FloatElement T>
  void all_gather(std::type_identity_t<std::span<const T>> in, std::span<T> out) {
    self_->all_gather(erase(in), erase(out), false);
  }
  template <FloatElement T>
  CommHandle all_gather_async(std::type_identity_t<std::span<const T>> in, std::span<T> out) {
    return self_->all_gather(erase(in), erase(out), true);
  }
  template <FloatElement T>
  void broadcast(std::span<T> buf, int root) {
    self_->broadcast(erase(buf), root, false);
  }
  template <FloatElement T>
  CommHandle broadcast_async(std::span<T> buf, int root) {
    return self_->broadcast(erase(buf), root, true);
  }
  template <FloatElement T>
  void reduce(std::span<T> buf, int root, ReduceOp op = ReduceOp::Sum) {
    self_->reduce(erase(buf), root, op, false);
  }
  template <FloatElement T>
  CommHandle reduce_async(std::span<T> buf, int root, ReduceOp op = ReduceOp::Sum) {
    return self_->reduce(erase(buf), root, op, true);
  }

  void barrier() { self_->barrier(false); }
  CommHandle barrier_async() { return self_->barrier(true); }

  /// The wrapped backend's split, owned by the new wrapper.
  AnyCommunicator split(int color, int key) { return AnyCommunicator(self_->split(color, key)); }

  CommStats& stats() { return self_->stats(); }
  const CommStats& stats() const { return self_->stats(); }
  void set_timeout(std::chrono::milliseconds timeout) { self_->set_timeout(timeout); }
  std::chrono::milliseconds timeout() const { return self_->timeout(); }

 private:
  /// A buffer of any element type: what crosses the virtual call.
  struct Buffer {
    void* data;
    std::size_t count;
    DType dtype;
  };
  template <class T>
  static Buffer erase(std::span<T> s) {
    return {const_cast<std::remove_const_t<T>*>(s.data()), s.size(), dtype_v<std::remove_const_t<T>>};
  }

  struct Interface {
    virtual ~Interface() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual CommHandle all_reduce(Buffer buf, ReduceOp op, bool async) = 0;
    virtual CommHandle reduce_scatter(Buffer in, Buffer out, ReduceOp op, bool async) = 0;
    virtual CommHandle all_gather(Buffer in, Buffer out, bool async) = 0;
    virtual CommHandle broadcast(Buffer buf, int root, bool async) = 0;
    virtual CommHandle reduce(Buffer buf, int root, ReduceOp op, bool async) = 0;
    virtual CommHandle barrier(bool async) = 0;
    virtual std::unique_ptr<Interface> split(int color, int key) = 0;
    virtual CommStats& stats() = 0;
    virtual const CommStats& stats() const = 0;
    virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
    virtual std::chrono::milliseconds timeout() const = 0;
  };

  /// Forwards to the backend `comm()` returns; Owned and Borrowed say where it lives.
  template <class C, class Derived>
  struct Forward : Interface {
    C& c() { return static_cast<Derived*>(this)->comm(); }
    const C& c() const { return static_cast<const Derived*>(this)->comm(); }

    /// Calls f.template operator()<T>() with the element type of `dtype`.
    template <class F>
    static CommHandle typed(DType dtype, F&& f) {
      switch (dtype) {
        case DType::F32: return f.template operator()<float>();
        case DType::F64: return f.template operator()<double>();
        case DType::F16: return f.template operator()<half>();
        case DType::BF16: return f.template operator()<bfloat16>();
        default: detail::throw_error("AnyCommunicator: collectives move floating-point buffers only");
      }
    }
    template <class T>
    static std::span<T> as(Buffer b) {
      return {static_cast<T*>(b.data), b.count};
    }

    int rank() const override { return c().rank(); }
    int size() const override { return c().size(); }
    CommHandle all_reduce(Buffer buf, ReduceOp op, bool async) override {
      return typed(buf.dtype, [&]<class T>() {
        if (async) return c().all_reduce_async(as<T>(buf), op);
        c().all_reduce(as<T>(buf), op);
        return CommHandle();
      });
    }
    CommHandle reduce_scatter(Buffer in, Buffer out, ReduceOp op, bool async) override {
      return typed(out.dtype, [&]<class T>() {
        const std::span<const T> from = as<T>(in);
        if (async) return c().template reduce_scatter_async<T>(from, as<T>(out), op);
        c().template reduce_scatter<T>(from, as<T>(out), op);
        return CommHandle();
      });
    }
    CommHandle all_gather(Buffer in, Buffer out, bool async) override {
      return typed(out.dtype, [&]<class T>() {
        const std::span<const T> from = as<T>(in);
        if (async) return c().template all_gather_async<T>(from, as<T>(out));
        c().template all_gather<T>(from, as<T>(out));
        return CommHandle();
      });
    }
    CommHandle broadcast(Buffer buf, int root, bool async) override {
      return typed(buf.dtype, [&]<class T>() {
        if (async) return c().broadcast_async(as<T>(buf), root);
        c().broadcast(as<T>(buf), root);
        return CommHandle();
      });
    }
    CommHandle reduce(Buffer buf, int root, ReduceOp op, bool async) override {
      return typed(buf.dtype, [&]<class T>() {
        if (async) return c().reduce_async(as<T>(buf), root, op);
        c().reduce(as<T>(buf), root, op);
        return CommHandle();
      });
    }
    CommHandle barrier(bool async) override {
      if (async) return c().barrier_async();
      c().barrier();
      return CommHandle();
    }
    std::unique_ptr<Interface> split(int color, int key) override;
    CommStats& stats() override { return c().stats(); }
    const CommStats& stats() const override { return c().stats(); }
    void set_timeout(std::chrono::milliseconds timeout) override { c().set_timeout(timeout); }
    std::chrono::milliseconds timeout() const override { return c().timeout(); }
  };

  template <class C>
  struct Owned final : Forward<C, Owned<C>> {
    explicit Owned(C&& c) : held(std::move(c)) {}
    C& comm() { return held; }
    const C& comm() const { return held; }
    C held;
  };

  template <class C>
  struct Borrowed final : Forward<C, Borrowed<C>> {
    explicit Borrowed(C& c) : held(&c) {}
    C& comm() { return *held; }
    const C& comm() const { return *held; }
    C* held;
  };

  explicit AnyCommunicator(std::unique_ptr<Interface> self) : self_(std::move(self)) {}

  std::unique_ptr<Interface> self_;
};

template <class C, class Derived>
std::unique_ptr<AnyCommunicator::Interface> AnyCommunicator::Forward<C, Derived>::split(int color, int key) {
  return std::make_unique<Owned<C>>(c().split(color, key));
}

static_assert(Communicator<AnyCommunicator>);

}  // namespace polyshard
