// Reading safetensors files into tensors: the header is validated against the file size before
// anything is allocated, and each tensor is read (optionally converted) on request.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "polyshard/io/safetensors_header.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// Whether reading a tensor stored in one dtype into another is allowed.
enum class DTypeConversion {
  exact,   ///< the file's dtype must be the destination's: an error otherwise
  convert  ///< convert element by element (element_cast: round to nearest even into 16-bit
           ///< types); floating point to and from integers is still refused
};

namespace detail {

/// Where the bytes of a safetensors file come from: an open file or a buffer in memory.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual std::uint64_t size() const = 0;
  /// Reads exactly `n` bytes at `offset` (offset + n <= size(), checked by the caller).
  virtual void read(std::uint64_t offset, std::byte* dst, std::size_t n) const = 0;
};

class FileByteSource final : public ByteSource {
 public:
  explicit FileByteSource(const std::filesystem::path& path) : path_(path.string()) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) safetensors_error(path_, "cannot open: ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      ::close(fd_);
      safetensors_error(path_, "cannot stat: ", std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      safetensors_error(path_, "not a regular file");
    }
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  ~FileByteSource() override { ::close(fd_); }
  FileByteSource(const FileByteSource&) = delete;
  FileByteSource& operator=(const FileByteSource&) = delete;

  std::uint64_t size() const override { return size_; }
  void read(std::uint64_t offset, std::byte* dst, std::size_t n) const override {
    while (n > 0) {
      const ssize_t got = ::pread(fd_, dst, n, static_cast<off_t>(offset));
      if (got < 0) {
        if (errno == EINTR) continue;
        safetensors_error(path_, "read failed at byte ", offset, ": ", std::strerror(errno));
      }
      if (got == 0) safetensors_error(path_, "the file ended at byte ", offset, " (was it truncated while open?)");
      dst += got;
      offset += static_cast<std::uint64_t>(got);
      n -= static_cast<std::size_t>(got);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

class MemoryByteSource final : public ByteSource {
 public:
  explicit MemoryByteSource(std::span<const std::byte> bytes) : bytes_(bytes) {}
  std::uint64_t size() const override { return bytes_.size(); }
  void read(std::uint64_t offset, std::byte* dst, std::size_t n) const override {
    if (n) std::memcpy(dst, bytes_.data() + offset, n);  // an empty tensor may have no buffer at all
  }

 private:
  std::span<const std::byte> bytes_;
};

inline std::string shape_string(std::span<const std::int64_t> shape) {
  std::ostringstream out;
  out << '(';
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) out << ',';
  out << ')';
  return out.str();
}

/// Calls f(T{}) with a value of the element type that `d` names.
template <class F>
decltype(auto) visit_dtype(DType d, F&& f) {
  switch (d) {
    case DType::F64: return f(double{});
    case DType::F32: return f(float{});
    case DType::F16: return f(half{});
    case DType::BF16: return f(bfloat16{});
    case DType::I64: return f(std::int64_t{});
    case DType::I32: return f(std::int32_t{});
  }
  throw_error("visit_dtype: unknown dtype");
}

constexpr bool is_float_dtype(DType d) {
  return d == DType::F64 || d == DType::F32 || d == DType::F16 || d == DType::BF16;
}

}  // namespace detail

/// An open safetensors file with a validated header. Reading tensors is const and may run
/// from several threads at once. Copies share the open file.
class SafetensorsFile {
 public:
  /// Opens and validates `path`; throws polyshard::Error naming the file and what is wrong
  /// (see parse_safetensors_header for every check).
  static SafetensorsFile open(const std::filesystem::path& path) {
    return SafetensorsFile(std::make_shared<detail::FileByteSource>(path), path.string());
  }
  /// Validates a file held in memory; `bytes` must outlive the returned object and its copies.
  /// @param name  what errors call the file
  static SafetensorsFile from_memory(std::span<const std::byte> bytes, std::string name = "<memory>") {
    return SafetensorsFile(std::make_shared<detail::MemoryByteSource>(bytes), std::move(name));
  }

  /// The file's name as given to open().
  const std::string& name() const { return name_; }
  const SafetensorsHeader& header() const { return header_; }
  /// Every tensor, in data order.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return header_.tensors; }
  /// The "__metadata__" value of `key`, or nullptr.
  const std::string* metadata(std::string_view key) const { return header_.metadata_value(key); }

  /// The tensor named `name`, or nullptr.
  const SafetensorsTensorInfo* find(std::string_view name) const {
    const auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &header_.tensors[it->second];
  }
  /// The tensor named `name`; throws an error naming the file when there is none.
  const SafetensorsTensorInfo& info(std::string_view name) const {
    const SafetensorsTensorInfo* t = find(name);
    if (!t) detail::safetensors_error(name_, "no tensor named '", name, "'");
    return *t;
  }

  /// Copies the raw little-endian bytes of `t` (t.nbytes() of them) into `dst`.
  void read_bytes(const SafetensorsTensorInfo& t, std::span<std::byte> dst) const {
    POLYSHARD_CHECK(dst.size() == t.nbytes(), "SafetensorsFile::read_bytes: tensor '", t.name, "' has ", t.nbytes(),
                    " bytes but the destination ", dst.size());
    source_->read(t.data_begin, dst.data(), dst.size());
  }

  /// Reads tensor `name` into a new contiguous Tensor<T> of the file's shape.
  /// @param conversion  whether a tensor stored in another dtype is converted (default: refused)
  /// @param category    memory category the new tensor is counted under
  template <Element T>
  Tensor<T> read(std::string_view name, DTypeConversion conversion = DTypeConversion::exact,
                 MemoryCategory category = current_memory_category()) const {
    const SafetensorsTensorInfo& t = info(name);
    if (t.shape.size() > static_cast<std::size_t>(Shape::max_rank))
      detail::safetensors_error(name_, "tensor '", t.name, "' has ", t.shape.size(), " dimensions; polyshard tensors have at most ",
                                Shape::max_rank);
    // A tensor with a zero extent holds nothing, yet its other extents may be absurd: refuse
    // those whose strides would overflow rather than compute them.
    std::int64_t stride = 1;
    for (const std::int64_t e : t.shape)
      if (e != 0 && __builtin_mul_overflow(stride, e, &stride))
        detail::safetensors_error(name_, "tensor '", t.name, "' has shape ", detail::shape_string(t.shape),
                                  ", too large for a tensor's strides");
    check_readable<T>(t, conversion);
    Tensor<T> out = Tensor<T>::empty(Shape(std::span<const std::int64_t>(t.shape)), category);
    copy_elements(t, out.data());
    return out;
  }

  /// Reads tensor `name` into `dst`, which must be contiguous and have the file's shape.
  /// @param conversion  whether a tensor stored in another dtype is converted (default: refused)
  template <Element T>
  void read_into(std::string_view name, const Tensor<T>& dst, DTypeConversion conversion = DTypeConversion::exact) const {
    const SafetensorsTensorInfo& t = info(name);
    const Shape& s = dst.shape();
    if (!std::equal(t.shape.begin(), t.shape.end(), s.begin(), s.end()))
      detail::safetensors_error(name_, "tensor '", t.name, "' has shape ", detail::shape_string(t.shape),
                                " but the destination has shape ", s);
    POLYSHARD_CHECK(dst.is_contiguous(), "SafetensorsFile::read_into: destination of tensor '", t.name,
                    "' is not contiguous");
    check_readable<T>(t, conversion);
    copy_elements(t, dst.data());
  }

  /// Reads elements [first, first + dst.size()) of tensor `name`, in its row-major order, into
  /// `dst`: a slice of a tensor without reading the rest (sharded checkpoints read this way).
  /// @param conversion  whether a tensor stored in another dtype is converted (default: refused)
  template <Element T>
  void read_elements(std::string_view name, std::uint64_t first, std::span<T> dst,
                     DTypeConversion conversion = DTypeConversion::exact) const {
    const SafetensorsTensorInfo& t = info(name);
    if (first > t.numel || dst.size() > t.numel - first)
      detail::safetensors_error(name_, "tensor '", t.name, "' has ", t.numel, " elements; elements [", first, ", ",
                                first + dst.size(), ") were asked for");
    check_readable<T>(t, conversion);
    copy_elements(t, dst.data(), first, dst.size());
  }

 private:
  SafetensorsFile(std::shared_ptr<const detail::ByteSource> source, std::string name)
      : source_(std::move(source)), name_(std::move(name)) {
    unsigned char prefix[8] = {};
    const std::uint64_t size = source_->size();
    if (size >= 8) source_->read(0, reinterpret_cast<std::byte*>(prefix), 8);
    const std::uint64_t n = validate_safetensors_prefix(name_, prefix, size);
    std::string json(static_cast<std::size_t>(n), '\0');  // n <= min(file size, 100 MB): checked above
    source_->read(8, reinterpret_cast<std::byte*>(json.data()), json.size());
    header_ = parse_safetensors_header(name_, json, size);
    index_.reserve(header_.tensors.size());
    for (std::size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
  }

  template <Element T>
  void check_readable(const SafetensorsTensorInfo& t, DTypeConversion conversion) const {
    const auto core = to_core_dtype(t.dtype);
    if (!core)
      detail::safetensors_error(name_, "tensor '", t.name, "' has dtype ", safetensors_dtype_name(t.dtype),
                                ", which polyshard does not read");
    if (*core == dtype_v<T>) return;
    if (conversion == DTypeConversion::exact)
      detail::safetensors_error(name_, "tensor '", t.name, "' is stored as ", dtype_name(*core), ", not ",
                                dtype_name_v<T>, " (ask for DTypeConversion::convert to convert it)");
    if (detail::is_float_dtype(*core) != FloatElement<T>)
      detail::safetensors_error(name_, "tensor '", t.name, "' is stored as ", dtype_name(*core),
                                ", which does not convert to ", dtype_name_v<T>, " (integers and floating point do not mix)");
  }

  // Reads the elements of `t` into `out`, converting in bounded chunks so that a conversion never
  // holds a second copy of a large tensor.
  template <Element T>
  void copy_elements(const SafetensorsTensorInfo& t, T* out) const {
    copy_elements(t, out, 0, t.numel);
  }
  // Elements [first, first + count) of `t` (checked by the caller) into `out`.
  template <Element T>
  void copy_elements(const SafetensorsTensorInfo& t, T* out, std::uint64_t first, std::uint64_t count) const {
    const DType from = *to_core_dtype(t.dtype);
    if (from == dtype_v<T>) {
      source_->read(t.data_begin + first * sizeof(T), reinterpret_cast<std::byte*>(out),
                    static_cast<std::size_t>(count * sizeof(T)));
      return;
    }
    detail::visit_dtype(from, [&](auto tag) {
      using S = decltype(tag);
      if constexpr (FloatElement<S> == FloatElement<T>) {
        constexpr std::uint64_t chunk = 1 << 16;
        std::vector<S> buffer(static_cast<std::size_t>(std::min<std::uint64_t>(chunk, count)));
        for (std::uint64_t done = 0; done < count;) {
          const std::uint64_t n = std::min<std::uint64_t>(chunk, count - done);
          source_->read(t.data_begin + (first + done) * sizeof(S), reinterpret_cast<std::byte*>(buffer.data()),
                        static_cast<std::size_t>(n * sizeof(S)));
          for (std::uint64_t i = 0; i < n; ++i) out[done + i] = element_cast<T>(buffer[i]);
          done += n;
        }
      }
    });
  }

  std::shared_ptr<const detail::ByteSource> source_;
  std::string name_;
  SafetensorsHeader header_;
  std::unordered_map<std::string, std::size_t> index_;
};

}  // namespace polyshard
