// The emulated cuBLASLt: defines the cublasLt.h functions polyshard calls, over the emulated CUDA
// runtime, so that a program compiled against the real header links against this unchanged. Every
// product is a plain reference loop written from cuBLASLt's documented contract (column-major
// layouts, op(A) op(B), alpha and beta, the epilogues), never the project's own CPU matmul: a wrong
// layout, leading dimension, transpose or epilogue direction in the caller gives a wrong product.
//
// What cuBLASLt would refuse is refused, and what this file does not implement (an attribute value,
// a data type, a memory order, an epilogue) is refused too, never ignored: each refusal prints a
// line prefixed "polyshard emulated cuBLASLt: " naming the call, the attribute and its value.
// Pointers must be device memory of the stream's device with the whole matrix inside its
// allocation; one that is not is reported through report_launch_error, as a GPU would fault on it.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iostream>
#include <limits>
#include <new>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "polyshard/emulation/initcheck.hpp"
#include "polyshard/emulation/runtime.hpp"

// cublasLt.h only declares the handle's struct: the emulation's handle is this.
struct cublasLtContext {
  std::uint32_t magic = 0;
  int device = 0;  // the current device at cublasLtCreate (informative: matmuls follow their stream)
};

namespace polyshard::emulation {
namespace {

// Tags written into every object this file creates, so that an uninitialised or destroyed
// descriptor, or an algorithm that did not come from the heuristic, is refused rather than read.
constexpr std::uint32_t handle_magic = 0x504C5448;        // "PLTH"
constexpr std::uint32_t layout_magic = 0x504C544C;        // "PLTL"
constexpr std::uint32_t desc_magic = 0x504C5444;          // "PLTD"
constexpr std::uint32_t preference_magic = 0x504C5450;    // "PLTP"
constexpr std::uint64_t algo_magic = 0x504C54416C676F31;  // "PLTAlgo1"

constexpr std::int64_t int32_max = std::numeric_limits<std::int32_t>::max();

template <class... Parts>
std::string text(const Parts&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  return s.str();
}

/// Prints why a call is refused and returns its status: every refusal goes through here.
cublasStatus_t refuse(cublasStatus_t status, const std::string& message) {
  std::cerr << "polyshard emulated cuBLASLt: " << message << std::endl;
  return status;
}

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "<unrecognized cuBLAS status>";
}

const char* status_string(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "error detected trying to check the license";
  }
  return "unrecognized cuBLAS status";
}

std::string type_name(std::int64_t t) {
  switch (t) {
    case CUDA_R_32F:
      return "CUDA_R_32F";
    case CUDA_R_16F:
      return "CUDA_R_16F";
    case CUDA_R_16BF:
      return "CUDA_R_16BF";
    case CUDA_R_64F:
      return "CUDA_R_64F";
    case CUDA_R_8I:
      return "CUDA_R_8I";
    case CUDA_R_32I:
      return "CUDA_R_32I";
    case CUDA_R_8F_E4M3:
      return "CUDA_R_8F_E4M3";
    case CUDA_R_8F_E5M2:
      return "CUDA_R_8F_E5M2";
    case -1:
      return "-1 (the output's type)";
  }
  return text("cudaDataType ", t);
}

/// Bytes per element of the types the product implements (0 for any other).
std::size_t element_bytes(std::int64_t t) {
  switch (t) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
  }
  return 0;
}

std::string epilogue_name(std::uint32_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      return "CUBLASLT_EPILOGUE_DEFAULT";
    case CUBLASLT_EPILOGUE_RELU:
      return "CUBLASLT_EPILOGUE_RELU";
    case CUBLASLT_EPILOGUE_RELU_AUX:
      return "CUBLASLT_EPILOGUE_RELU_AUX";
    case CUBLASLT_EPILOGUE_BIAS:
      return "CUBLASLT_EPILOGUE_BIAS";
    case CUBLASLT_EPILOGUE_RELU_BIAS:
      return "CUBLASLT_EPILOGUE_RELU_BIAS";
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS:
      return "CUBLASLT_EPILOGUE_RELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DRELU:
      return "CUBLASLT_EPILOGUE_DRELU";
    case CUBLASLT_EPILOGUE_DRELU_BGRAD:
      return "CUBLASLT_EPILOGUE_DRELU_BGRAD";
    case CUBLASLT_EPILOGUE_GELU:
      return "CUBLASLT_EPILOGUE_GELU";
    case CUBLASLT_EPILOGUE_GELU_AUX:
      return "CUBLASLT_EPILOGUE_GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_BIAS:
      return "CUBLASLT_EPILOGUE_GELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      return "CUBLASLT_EPILOGUE_GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU:
      return "CUBLASLT_EPILOGUE_DGELU";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
      return "CUBLASLT_EPILOGUE_DGELU_BGRAD";
    case CUBLASLT_EPILOGUE_BGRADA:
      return "CUBLASLT_EPILOGUE_BGRADA";
    case CUBLASLT_EPILOGUE_BGRADB:
      return "CUBLASLT_EPILOGUE_BGRADB";
  }
  return text("epilogue ", e);
}

std::string op_name(std::int32_t op) {
  switch (op) {
    case CUBLAS_OP_N:
      return "CUBLAS_OP_N";
    case CUBLAS_OP_T:
      return "CUBLAS_OP_T";
    case CUBLAS_OP_C:
      return "CUBLAS_OP_C";
    case CUBLAS_OP_CONJG:
      return "CUBLAS_OP_CONJG";
  }
  return text("operation ", op);
}

// ---------------------------------------------------------------------------------------------
// Descriptors. Each lives inside the opaque storage cublasLt.h gives it (so that the header's
// static-inline *Init functions work on caller-provided storage too) and keeps every attribute
// cuBLASLt defines, as set, the way the real library does: a value is judged when a heuristic or a
// matmul uses it, not when it is set.
// ---------------------------------------------------------------------------------------------

struct Layout {
  std::uint32_t magic;
  std::uint32_t type;  // cudaDataType
  std::int32_t order;
  std::int32_t batch_count;
  std::uint64_t rows, cols;
  std::int64_t ld;
  std::int64_t batch_stride;  // elements between batch items
  std::int64_t plane_offset;
  std::uint32_t batch_mode;
};
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t));

struct MatmulDesc {
  std::uint32_t magic;
  std::int32_t compute_type, scale_type, pointer_mode, transa, transb, transc, fill_mode;
  std::uint32_t epilogue;
  std::int32_t sm_count_target, aux_data_type, bias_data_type;
  std::int32_t a_scale_mode, b_scale_mode, c_scale_mode, d_scale_mode, aux_scale_mode, d_out_scale_mode;
  std::int8_t fast_accum;
  const void* bias;
  std::int64_t bias_batch_stride;
  void* aux;
  std::int64_t aux_ld, aux_batch_stride, alpha_vector_batch_stride;
  const void *a_scale, *b_scale, *c_scale, *d_scale;
  void *amax_d, *aux_scale, *aux_amax, *d_out_scale;
  cublasLtEmulationDesc_t emulation;
};
static_assert(sizeof(MatmulDesc) <= sizeof(cublasLtMatmulDescOpaque_t));

struct Preference {
  std::uint32_t magic;
  std::uint32_t search_mode;
  std::uint64_t max_workspace;
  std::uint32_t reduction_mask;
  std::uint32_t align_a, align_b, align_c, align_d;
  float max_waves;
  std::uint64_t impl_mask;
};
static_assert(sizeof(Preference) <= sizeof(cublasLtMatmulPreferenceOpaque_t));

/// One attribute: where it lives in its descriptor and how many bytes it has.
struct Field {
  int attr;
  const char* name;
  std::size_t offset, size;
};
#define POLYSHARD_FIELD(Struct, attr, member) \
  Field { attr, #attr, offsetof(Struct, member), sizeof(Struct::member) }

const Field layout_fields[] = {
    POLYSHARD_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_TYPE, type),
    POLYSHARD_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_ORDER, order),
    POLYSHARD_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_ROWS, rows),
    POLYSHARD_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_COLS, cols),
    POLYSHARD_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_LD, ld),
    POLYSHARD_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, batch_count),
    POLYSHARD_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, batch_stride),
    POLYSHARD_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, plane_offset),
    POLYSHARD_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, batch_mode),
};

const Field desc_fields[] = {
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, compute_type),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_SCALE_TYPE, scale_type),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_POINTER_MODE, pointer_mode),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_TRANSA, transa),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_TRANSB, transb),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_TRANSC, transc),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_FILL_MODE, fill_mode),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, bias_batch_stride),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, aux_batch_stride),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, alpha_vector_batch_stride),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, sm_count_target),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, c_scale),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, d_scale),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, amax_d),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, aux_data_type),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, aux_scale),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER, aux_amax),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_data_type),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_scale_mode),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_scale_mode),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_C_SCALE_MODE, c_scale_mode),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_D_SCALE_MODE, d_scale_mode),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE, aux_scale_mode),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER, d_out_scale),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE, d_out_scale_mode),
    POLYSHARD_FIELD(MatmulDesc, CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR, emulation),
};

const Field preference_fields[] = {
    POLYSHARD_FIELD(Preference, CUBLASLT_MATMUL_PREF_SEARCH_MODE, search_mode),
    POLYSHARD_FIELD(Preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace),
    POLYSHARD_FIELD(Preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reduction_mask),
    POLYSHARD_FIELD(Preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a),
    POLYSHARD_FIELD(Preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b),
    POLYSHARD_FIELD(Preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c),
    POLYSHARD_FIELD(Preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d),
    POLYSHARD_FIELD(Preference, CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, max_waves),
    POLYSHARD_FIELD(Preference, CUBLASLT_MATMUL_PREF_IMPL_MASK, impl_mask),
};
#undef POLYSHARD_FIELD

template <std::size_t N>
const Field* find_field(const Field (&fields)[N], int attr) {
  for (const Field& f : fields)
    if (f.attr == attr) return &f;
  return nullptr;
}

/// SetAttribute: the value's size must be the attribute's, as cuBLASLt checks.
template <class Object, std::size_t N>
cublasStatus_t set_field(const char* call, Object* object, const Field (&fields)[N], int attr, const void* buf,
                         std::size_t size) {
  const Field* f = find_field(fields, attr);
  if (!f) return refuse(CUBLAS_STATUS_INVALID_VALUE, text(call, ": attribute ", attr, " is not one cuBLASLt defines"));
  if (!buf) return refuse(CUBLAS_STATUS_INVALID_VALUE, text(call, "(", f->name, "): the value pointer is null"));
  if (size != f->size)
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  text(call, "(", f->name, "): sizeInBytes is ", size, ", the attribute has ", f->size, " bytes"));
  std::memcpy(reinterpret_cast<char*>(object) + f->offset, buf, size);
  return CUBLAS_STATUS_SUCCESS;
}

/// GetAttribute: sizeInBytes 0 asks for the size; otherwise it must be the attribute's.
template <class Object, std::size_t N>
cublasStatus_t get_field(const char* call, const Object* object, const Field (&fields)[N], int attr, void* buf,
                         std::size_t size, std::size_t* written) {
  const Field* f = find_field(fields, attr);
  if (!f) return refuse(CUBLAS_STATUS_INVALID_VALUE, text(call, ": attribute ", attr, " is not one cuBLASLt defines"));
  if (size == 0) {
    if (!written)
      return refuse(CUBLAS_STATUS_INVALID_VALUE,
                    text(call, "(", f->name, "): sizeInBytes is 0 and sizeWritten is null"));
    *written = f->size;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (!buf) return refuse(CUBLAS_STATUS_INVALID_VALUE, text(call, "(", f->name, "): the buffer is null"));
  if (size != f->size)
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  text(call, "(", f->name, "): sizeInBytes is ", size, ", the attribute has ", f->size, " bytes"));
  std::memcpy(buf, reinterpret_cast<const char*>(object) + f->offset, size);
  if (written) *written = size;
  return CUBLAS_STATUS_SUCCESS;
}

// The descriptors live in the opaque storage; these find them and check the tag.
Layout* layout_of(cublasLtMatrixLayout_t l) {
  if (!l) return nullptr;
  auto* p = std::launder(reinterpret_cast<Layout*>(l));
  return p->magic == layout_magic ? p : nullptr;
}
MatmulDesc* desc_of(cublasLtMatmulDesc_t d) {
  if (!d) return nullptr;
  auto* p = std::launder(reinterpret_cast<MatmulDesc*>(d));
  return p->magic == desc_magic ? p : nullptr;
}
Preference* preference_of(cublasLtMatmulPreference_t pr) {
  if (!pr) return nullptr;
  auto* p = std::launder(reinterpret_cast<Preference*>(pr));
  return p->magic == preference_magic ? p : nullptr;
}

// ---------------------------------------------------------------------------------------------
// The problem: what the descriptors describe, checked once for the heuristic and the matmul.
// ---------------------------------------------------------------------------------------------

/// One matrix as its layout describes it (column-major).
struct Matrix {
  std::int64_t rows = 0, cols = 0, ld = 0, batch = 1, stride = 0;
  /// Elements from the first item's start to one past the last item's last element.
  std::int64_t extent() const {
    if (rows == 0 || cols == 0) return 0;
    return (batch > 1 ? (batch - 1) * stride : 0) + (cols - 1) * ld + rows;
  }
};

enum class Vector { none, bias_in, bias_grad };

struct Problem {
  std::int64_t type = CUDA_R_32F;  // of A, B, C and D alike
  std::size_t bytes = 4;           // per element
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0, batch = 1;  // D: (m, n); op(A): (m, k); op(B): (k, n)
  Matrix a, b, c, d;
  std::uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  Vector vector = Vector::none;
  std::int64_t vector_length = 0;  // bias (m), DGELU_BGRAD (m), BGRADA (m), BGRADB (n)
  std::int64_t bias_stride = 0;    // between batch items' biases
  bool aux_written = false, aux_read = false;
  std::int64_t aux_ld = 0;
};

bool adds_bias(std::uint32_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool applies_gelu(std::uint32_t e) {
  return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
         e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool applies_dgelu(std::uint32_t e) { return e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD; }

/// Checks a layout's own attributes and reads it into `out`; `name` is "A", "B", "C" or "D".
cublasStatus_t read_layout(const char* call, const char* name, cublasLtMatrixLayout_t handle, Matrix& out,
                           std::int64_t& type) {
  const Layout* l = layout_of(handle);
  if (!l) return refuse(CUBLAS_STATUS_INVALID_VALUE, text(call, ": the layout of ", name, " is null or not a layout"));
  if (l->order != CUBLASLT_ORDER_COL)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  text(call, ": CUBLASLT_MATRIX_LAYOUT_ORDER = ", l->order, " of ", name,
                       " is not supported: the emulation implements CUBLASLT_ORDER_COL only"));
  if (l->batch_mode != CUBLASLT_BATCH_MODE_STRIDED)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, text(call, ": CUBLASLT_MATRIX_LAYOUT_BATCH_MODE = ", l->batch_mode,
                                                    " of ", name, " is not supported: strided batches only"));
  if (l->plane_offset != 0)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, text(call, ": CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET = ", l->plane_offset,
                                                    " of ", name, " is not supported (planar complex)"));
  if (l->rows > static_cast<std::uint64_t>(int32_max) || l->cols > static_cast<std::uint64_t>(int32_max))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  text(call, ": ", name, " is ", l->rows, " x ", l->cols, "; rows and columns must fit in 32 bits"));
  out.rows = static_cast<std::int64_t>(l->rows);
  out.cols = static_cast<std::int64_t>(l->cols);
  out.ld = l->ld;
  if (out.ld < 0 || out.ld < out.rows || (out.ld == 0 && out.cols > 0))
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  text(call, ": CUBLASLT_MATRIX_LAYOUT_LD = ", l->ld, " of ", name, " (", out.rows, " x ", out.cols,
                       ") is less than its ", out.rows, " rows: its columns would overlap"));
  if (l->batch_count < 1)
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  text(call, ": CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = ", l->batch_count, " of ", name, " must be >= 1"));
  out.batch = l->batch_count;
  out.stride = l->batch_stride;
  if (out.batch > 1 && out.stride < 0)
    return refuse(
        CUBLAS_STATUS_NOT_SUPPORTED,
        text(call, ": CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = ", out.stride, " of ", name, " is negative"));
  type = l->type;
  return CUBLAS_STATUS_SUCCESS;
}

/// Every check that needs no data pointer: the descriptor's attributes, the four layouts and
/// their agreement, the epilogue's requirements. Fills `p`.
cublasStatus_t read_problem(const char* call, const MatmulDesc* desc, cublasLtMatrixLayout_t la,
                            cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                            Problem& p) {
  if (!desc) return refuse(CUBLAS_STATUS_INVALID_VALUE, text(call, ": the matmul descriptor is null or not one"));

  // The descriptor: what this emulation computes is fp32 arithmetic on fp32 scalars.
  switch (desc->compute_type) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
    // The fast modes allow (never require) reduced-precision inputs: exact fp32 is one valid result.
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_TF32:
      break;
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                    text(call, ": CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = ", desc->compute_type,
                         " is not supported: CUBLAS_COMPUTE_32F (or its FAST_* and "
                         "PEDANTIC forms) only"));
  }
  if (desc->scale_type != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, text(call, ": CUBLASLT_MATMUL_DESC_SCALE_TYPE = ",
                                                    type_name(desc->scale_type), " is not supported: CUDA_R_32F only"));
  if (desc->pointer_mode != CUBLASLT_POINTER_MODE_HOST)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, text(call, ": CUBLASLT_MATMUL_DESC_POINTER_MODE = ", desc->pointer_mode,
                                                    " is not supported: CUBLASLT_POINTER_MODE_HOST only"));
  for (const auto& [attr, op] :
       {std::pair{"CUBLASLT_MATMUL_DESC_TRANSA", desc->transa}, std::pair{"CUBLASLT_MATMUL_DESC_TRANSB", desc->transb}})
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                    text(call, ": ", attr, " = ", op_name(op), " is not supported: CUBLAS_OP_N or CUBLAS_OP_T only"));
  if (desc->transc != CUBLAS_OP_N)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, text(call, ": CUBLASLT_MATMUL_DESC_TRANSC = ", op_name(desc->transc),
                                                    " is not supported: CUBLAS_OP_N only, as in cuBLASLt"));
  if (desc->fill_mode != CUBLAS_FILL_MODE_FULL)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, text(call, ": CUBLASLT_MATMUL_DESC_FILL_MODE = ", desc->fill_mode,
                                                    " is not supported: CUBLAS_FILL_MODE_FULL only"));
  // The attributes of scaled (fp8), vector-alpha and emulated products: only their defaults.
  const struct {
    const char* name;
    bool at_default;
    std::string value;
  } unimplemented[] = {
      {"CUBLASLT_MATMUL_DESC_A_SCALE_POINTER", desc->a_scale == nullptr, text(desc->a_scale)},
      {"CUBLASLT_MATMUL_DESC_B_SCALE_POINTER", desc->b_scale == nullptr, text(desc->b_scale)},
      {"CUBLASLT_MATMUL_DESC_C_SCALE_POINTER", desc->c_scale == nullptr, text(desc->c_scale)},
      {"CUBLASLT_MATMUL_DESC_D_SCALE_POINTER", desc->d_scale == nullptr, text(desc->d_scale)},
      {"CUBLASLT_MATMUL_DESC_AMAX_D_POINTER", desc->amax_d == nullptr, text(desc->amax_d)},
      {"CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER", desc->aux_scale == nullptr, text(desc->aux_scale)},
      {"CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER", desc->aux_amax == nullptr, text(desc->aux_amax)},
      {"CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER", desc->d_out_scale == nullptr, text(desc->d_out_scale)},
      {"CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR", desc->emulation == nullptr,
       text(static_cast<const void*>(desc->emulation))},
      {"CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE", desc->alpha_vector_batch_stride == 0,
       text(desc->alpha_vector_batch_stride)},
      {"CUBLASLT_MATMUL_DESC_FAST_ACCUM", desc->fast_accum == 0, text(int(desc->fast_accum))},
      {"CUBLASLT_MATMUL_DESC_A_SCALE_MODE", desc->a_scale_mode == 0, text(desc->a_scale_mode)},
      {"CUBLASLT_MATMUL_DESC_B_SCALE_MODE", desc->b_scale_mode == 0, text(desc->b_scale_mode)},
      {"CUBLASLT_MATMUL_DESC_C_SCALE_MODE", desc->c_scale_mode == 0, text(desc->c_scale_mode)},
      {"CUBLASLT_MATMUL_DESC_D_SCALE_MODE", desc->d_scale_mode == 0, text(desc->d_scale_mode)},
      {"CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE", desc->aux_scale_mode == 0, text(desc->aux_scale_mode)},
      {"CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE", desc->d_out_scale_mode == 0, text(desc->d_out_scale_mode)},
  };
  for (const auto& u : unimplemented)
    if (!u.at_default)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, text(call, ": ", u.name, " = ", u.value,
                                                      " is not supported: the emulation implements its default only"));
  // CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET is a performance hint with no effect on the result: any value is fine.

  // The layouts.
  std::int64_t ta = 0, tb = 0, tc = 0, td = 0;
  if (auto rc = read_layout(call, "A", la, p.a, ta); rc != CUBLAS_STATUS_SUCCESS) return rc;
  if (auto rc = read_layout(call, "B", lb, p.b, tb); rc != CUBLAS_STATUS_SUCCESS) return rc;
  if (auto rc = read_layout(call, "C", lc, p.c, tc); rc != CUBLAS_STATUS_SUCCESS) return rc;
  if (auto rc = read_layout(call, "D", ld, p.d, td); rc != CUBLAS_STATUS_SUCCESS) return rc;
  if (element_bytes(td) == 0)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, text(call, ": CUBLASLT_MATRIX_LAYOUT_TYPE = ", type_name(td),
                                                    " of D is not supported: CUDA_R_32F, CUDA_R_16F or CUDA_R_16BF"));
  if (ta != td || tb != td || tc != td)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  text(call, ": the types of A, B, C and D are ", type_name(ta), ", ", type_name(tb), ", ",
                       type_name(tc), ", ", type_name(td), "; the emulation implements one type for all four"));
  p.type = td;
  p.bytes = element_bytes(td);

  // The shapes: D (m, n) = op(A) (m, k) op(B) (k, n) + C (m, n).
  p.trans_a = desc->transa == CUBLAS_OP_T;
  p.trans_b = desc->transb == CUBLAS_OP_T;
  p.m = p.d.rows;
  p.n = p.d.cols;
  p.k = p.trans_a ? p.a.rows : p.a.cols;
  const std::int64_t a_m = p.trans_a ? p.a.cols : p.a.rows;
  const std::int64_t b_k = p.trans_b ? p.b.cols : p.b.rows;
  const std::int64_t b_n = p.trans_b ? p.b.rows : p.b.cols;
  const auto shape = [&] {
    return text(" (op(A) is ", a_m, " x ", p.k, " with TRANSA ", op_name(desc->transa), ", op(B) is ", b_k, " x ", b_n,
                " with TRANSB ", op_name(desc->transb), ", C is ", p.c.rows, " x ", p.c.cols, ", D is ", p.m, " x ",
                p.n, ")");
  };
  if (a_m != p.m || b_n != p.n || b_k != p.k || p.c.rows != p.m || p.c.cols != p.n)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, text(call, ": the dimensions do not agree", shape()));
  if (p.k == 0 && p.m > 0 && p.n > 0)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  text(call, ": k = 0 (an empty inner dimension) is not supported", shape()));
  if (p.a.batch != p.d.batch || p.b.batch != p.d.batch || p.c.batch != p.d.batch)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, text(call, ": CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT differs: A ", p.a.batch,
                                                    ", B ", p.b.batch, ", C ", p.c.batch, ", D ", p.d.batch));
  p.batch = p.d.batch;
  if (p.batch > 1 && p.m > 0 && p.n > 0 && p.d.stride < (p.n - 1) * p.d.ld + p.m)
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  text(call, ": CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = ", p.d.stride, " of D makes its ",
                       p.batch, " items overlap: each spans ", (p.n - 1) * p.d.ld + p.m, " elements"));

  // The epilogue.
  p.epilogue = desc->epilogue;
  switch (p.epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT:
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_GELU:
    case CUBLASLT_EPILOGUE_GELU_AUX:
    case CUBLASLT_EPILOGUE_GELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DGELU:
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
    case CUBLASLT_EPILOGUE_BGRADA:
    case CUBLASLT_EPILOGUE_BGRADB:
      break;
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                    text(call, ": CUBLASLT_MATMUL_DESC_EPILOGUE = ", epilogue_name(p.epilogue),
                         " is not supported: DEFAULT, BIAS, GELU, GELU_AUX, GELU_BIAS, GELU_AUX_BIAS, DGELU, "
                         "DGELU_BGRAD, BGRADA or BGRADB"));
  }
  const std::string e = epilogue_name(p.epilogue);
  if (adds_bias(p.epilogue)) {
    p.vector = Vector::bias_in;
    p.vector_length = p.m;  // one per row of D, broadcast over its columns
    p.bias_stride = desc->bias_batch_stride;
    if (p.batch > 1 && p.bias_stride < 0)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                    text(call, ": CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE = ", p.bias_stride, " is negative"));
  } else if (p.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD || p.epilogue == CUBLASLT_EPILOGUE_BGRADA) {
    p.vector = Vector::bias_grad;
    p.vector_length = p.m;
  } else if (p.epilogue == CUBLASLT_EPILOGUE_BGRADB) {
    p.vector = Vector::bias_grad;
    p.vector_length = p.n;
  }
  if (p.vector != Vector::none && desc->bias_data_type != -1 && desc->bias_data_type != p.type)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  text(call, ": CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = ", type_name(desc->bias_data_type), " with ", e,
                       " and D of ", type_name(p.type), ": the bias (or its gradient) has D's type"));
  p.aux_written = p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX || p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  p.aux_read = applies_dgelu(p.epilogue);
  if (p.aux_written || p.aux_read) {
    p.aux_ld = desc->aux_ld;
    if (p.aux_ld < p.m || p.aux_ld % 8 != 0 || p.aux_ld <= 0)
      return refuse(CUBLAS_STATUS_INVALID_VALUE,
                    text(call, ": CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = ", p.aux_ld, " with ", e,
                         ": it must be divisible by 8 and at least D's ", p.m, " rows"));
    if (desc->aux_data_type != -1 && desc->aux_data_type != p.type)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                    text(call, ": CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = ", type_name(desc->aux_data_type),
                         " with D of ", type_name(p.type), ": the GELU input is stored in D's type"));
  }
  if (p.batch > 1 && (p.aux_written || p.aux_read || p.vector == Vector::bias_grad))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  text(call, ": ", e, " with CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = ", p.batch,
                       " is not supported: the emulation runs it on one product"));
  // cuBLASLt reduces an operand into its bias gradient while it streams it along k: A untransposed,
  // B transposed (the weight gradient of a linear layer). Other layouts have no algorithm.
  if (p.epilogue == CUBLASLT_EPILOGUE_BGRADA && p.trans_a)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  text(call,
                       ": CUBLASLT_EPILOGUE_BGRADA with CUBLASLT_MATMUL_DESC_TRANSA = CUBLAS_OP_T is not "
                       "supported: BGRADA needs A untransposed"));
  if (p.epilogue == CUBLASLT_EPILOGUE_BGRADB && !p.trans_b)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  text(call,
                       ": CUBLASLT_EPILOGUE_BGRADB with CUBLASLT_MATMUL_DESC_TRANSB = CUBLAS_OP_N is not "
                       "supported: BGRADB needs B transposed"));
  return CUBLAS_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Algorithms. The heuristic offers one, which needs no workspace; it records the alignments the
// caller promised (capped at 16 bytes, the widest vector access a GPU kernel makes), and the
// matmul holds every pointer of every batch item to them: a caller that promises more than its
// pointers have would get a misaligned access on a GPU.
// ---------------------------------------------------------------------------------------------

constexpr std::uint32_t widest_access = 16;

struct AlgoRecord {
  std::uint32_t align_a, align_b, align_c, align_d, align_bias, align_aux;
  std::uint32_t epilogue;
  std::int64_t type;
};

cublasLtMatmulAlgo_t encode(const AlgoRecord& r) {
  cublasLtMatmulAlgo_t algo{};
  algo.data[0] = algo_magic;
  static_assert(sizeof(AlgoRecord) <= sizeof(algo.data) - sizeof(algo.data[0]));
  std::memcpy(&algo.data[1], &r, sizeof(r));
  return algo;
}

bool decode(const cublasLtMatmulAlgo_t& algo, AlgoRecord& r) {
  if (algo.data[0] != algo_magic) return false;
  std::memcpy(&r, &algo.data[1], sizeof(r));
  return true;
}

/// The largest power of two dividing the address, capped at 256; 256 for null (nothing to align).
std::uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 1;
  while (a < 256 && (address & a) == 0) a <<= 1;
  return a;
}

std::uint32_t required(std::uint32_t promised) { return promised < widest_access ? promised : widest_access; }

// ---------------------------------------------------------------------------------------------
// Memory: every matrix and vector must lie inside one device allocation of the stream's device.
// ---------------------------------------------------------------------------------------------

/// Empty when `bytes` bytes from `p` lie inside a device allocation of `device`, with `p` aligned
/// to `element` bytes (a GPU faults on a misaligned element); else why not.
std::string check_range(const std::string& what, const void* p, std::size_t bytes, int device,
                        std::size_t element = 1) {
  if (!p) return what + " is a null pointer";
  if (reinterpret_cast<std::uintptr_t>(p) % element != 0)
    return text(what, " at ", p, " is not aligned to its ", element, "-byte elements");
  const PointerInfo info = find_pointer(p);
  if (info.kind == MemoryKind::pinned_host)
    return text(what, " at ", p, " is pinned host memory, not device memory of device ", device);
  if (info.kind != MemoryKind::device)
    return text(what, " at ", p, " is not device memory (no live cudaMalloc allocation holds it)");
  if (info.device != device)
    return text(what, " at ", p, " is memory of device ", info.device, ", but the stream runs on device ", device);
  const auto offset = static_cast<std::size_t>(static_cast<const char*>(p) - static_cast<const char*>(info.base));
  if (offset + bytes > info.size)
    return text(what, " spans ", bytes, " bytes from ", p, ", which reaches ", offset + bytes - info.size,
                " bytes past the end of its allocation of ", info.size, " bytes at ", info.base);
  return {};
}

std::string describe(const char* name, const Matrix& x) {
  return text(name, " (", x.rows, " x ", x.cols, ", ld ", x.ld,
              x.batch > 1 ? text(", batch ", x.batch, " stride ", x.stride) : "", ")");
}

/// Everything a product reads and writes, captured by value when cublasLtMatmul is called: the
/// caller may change or destroy its descriptors as soon as the call returns.
struct Launch {
  Problem p;
  const void *a = nullptr, *b = nullptr, *c = nullptr;
  void* d = nullptr;
  const void* vector_in = nullptr;
  void* vector_out = nullptr;
  void* aux = nullptr;
  float alpha = 1, beta = 0;
  int device = 0;
};

/// Every range the launch touches, with its name, for the checks at the call and when it runs.
std::string check_ranges(const Launch& l) {
  const Problem& p = l.p;
  if (p.m == 0 || p.n == 0) return {};
  const auto bytes = [&](std::int64_t elements) { return static_cast<std::size_t>(elements) * p.bytes; };
  std::string why;
  if (why = check_range(describe("A", p.a), l.a, bytes(p.a.extent()), l.device, p.bytes); !why.empty()) return why;
  if (why = check_range(describe("B", p.b), l.b, bytes(p.b.extent()), l.device, p.bytes); !why.empty()) return why;
  if (l.beta != 0.0f)
    if (why = check_range(describe("C", p.c), l.c, bytes(p.c.extent()), l.device, p.bytes); !why.empty()) return why;
  if (why = check_range(describe("D", p.d), l.d, bytes(p.d.extent()), l.device, p.bytes); !why.empty()) return why;
  if (p.vector == Vector::bias_in) {
    const std::int64_t n = (p.batch > 1 ? (p.batch - 1) * p.bias_stride : 0) + p.vector_length;
    if (why = check_range(text("the bias (", p.vector_length, " elements)"), l.vector_in, bytes(n), l.device, p.bytes);
        !why.empty())
      return why;
  }
  if (p.vector == Vector::bias_grad)
    if (why = check_range(text("the bias gradient (", p.vector_length, " elements)"), l.vector_out,
                          bytes(p.vector_length), l.device, p.bytes);
        !why.empty())
      return why;
  if (p.aux_written || p.aux_read)
    if (why = check_range(text("the GELU aux matrix (", p.m, " x ", p.n, ", ld ", p.aux_ld, ")"), l.aux,
                          bytes((p.n - 1) * p.aux_ld + p.m), l.device, p.bytes);
        !why.empty())
      return why;
  return {};
}

// ---------------------------------------------------------------------------------------------
// The product.
// ---------------------------------------------------------------------------------------------

double load(const void* base, std::int64_t i, std::int64_t type) {
  switch (type) {
    case CUDA_R_32F:
      return static_cast<const float*>(base)[i];
    case CUDA_R_16F:
      return __half2float(static_cast<const __half*>(base)[i]);
    default:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  }
}

/// Rounds once, from double straight to the element type.
void store(void* base, std::int64_t i, std::int64_t type, double v) {
  switch (type) {
    case CUDA_R_32F:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      initcheck::written(static_cast<float*>(base) + i, sizeof(float));
      break;
    case CUDA_R_16F:
      static_cast<__half*>(base)[i] = __double2half(v);
      initcheck::written(static_cast<__half*>(base) + i, sizeof(__half));
      break;
    default:
      static_cast<__nv_bfloat16*>(base)[i] = __double2bfloat16(v);
      initcheck::written(static_cast<__nv_bfloat16*>(base) + i, sizeof(__nv_bfloat16));
      break;
  }
}

// GELU in the tanh form cuBLASLt's epilogues use (as GPT-2 and Transformer Engine do):
// gelu(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr double gelu_scale = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double gelu_cubic = 0.044715;

double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(gelu_scale * (x + gelu_cubic * x * x * x))); }

/// d gelu / dx of the same tanh form.
double gelu_grad(double x) {
  const double t = std::tanh(gelu_scale * (x + gelu_cubic * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * gelu_scale * (1.0 + 3.0 * gelu_cubic * x * x);
}

void run(const Launch& l) {
  const Problem& p = l.p;
  if (p.m == 0 || p.n == 0) return;
  // op(A) row by row and op(B) column by column, each contiguous along k, so that the inner loop
  // of every D(i, j) walks two arrays in order whatever the transposes.
  std::vector<double> op_a(static_cast<std::size_t>(p.m * p.k)), op_b(static_cast<std::size_t>(p.n * p.k));
  std::vector<double> row_sums;
  if (p.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) row_sums.assign(static_cast<std::size_t>(p.m), 0.0);
  const double alpha = l.alpha, beta = l.beta;

  for (std::int64_t item = 0; item < p.batch; ++item) {
    const std::int64_t a0 = item * p.a.stride, b0 = item * p.b.stride, c0 = item * p.c.stride, d0 = item * p.d.stride;
    // A is stored (m, k) column-major, or (k, m) when transposed; the same for B with (k, n).
    for (std::int64_t l_ = 0; l_ < p.k; ++l_)
      for (std::int64_t i = 0; i < p.m; ++i)
        op_a[static_cast<std::size_t>(i * p.k + l_)] =
            p.trans_a ? load(l.a, a0 + l_ + i * p.a.ld, p.type) : load(l.a, a0 + i + l_ * p.a.ld, p.type);
    for (std::int64_t j = 0; j < p.n; ++j)
      for (std::int64_t l_ = 0; l_ < p.k; ++l_)
        op_b[static_cast<std::size_t>(j * p.k + l_)] =
            p.trans_b ? load(l.b, b0 + j + l_ * p.b.ld, p.type) : load(l.b, b0 + l_ + j * p.b.ld, p.type);

    for (std::int64_t j = 0; j < p.n; ++j) {
      const double* bj = &op_b[static_cast<std::size_t>(j * p.k)];
      for (std::int64_t i = 0; i < p.m; ++i) {
        const double* ai = &op_a[static_cast<std::size_t>(i * p.k)];
        // Four partial sums: independent chains the CPU overlaps (the order of a reference sum is free).
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        std::int64_t l_ = 0;
        for (; l_ + 4 <= p.k; l_ += 4) {
          s0 += ai[l_] * bj[l_];
          s1 += ai[l_ + 1] * bj[l_ + 1];
          s2 += ai[l_ + 2] * bj[l_ + 2];
          s3 += ai[l_ + 3] * bj[l_ + 3];
        }
        for (; l_ < p.k; ++l_) s0 += ai[l_] * bj[l_];
        double x = alpha * ((s0 + s1) + (s2 + s3));
        // beta = 0: C is not read at all (it may be uninitialised, even NaN), as cuBLASLt does.
        if (beta != 0.0) x += beta * load(l.c, c0 + i + j * p.c.ld, p.type);
        if (adds_bias(p.epilogue)) x += load(l.vector_in, item * p.bias_stride + i, p.type);
        if (p.aux_written) store(l.aux, i + j * p.aux_ld, p.type, x);
        if (applies_gelu(p.epilogue)) x = gelu(x);
        if (applies_dgelu(p.epilogue)) x *= gelu_grad(load(l.aux, i + j * p.aux_ld, p.type));
        if (!row_sums.empty()) row_sums[static_cast<std::size_t>(i)] += x;
        store(l.d, d0 + i + j * p.d.ld, p.type, x);
      }
    }

    // The bias gradients: DGELU_BGRAD sums its result over D's columns; BGRADA sums op(A) and
    // BGRADB sums op(B) over k, as stored (alpha does not scale them).
    if (p.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD)
      for (std::int64_t i = 0; i < p.m; ++i) store(l.vector_out, i, p.type, row_sums[static_cast<std::size_t>(i)]);
    if (p.epilogue == CUBLASLT_EPILOGUE_BGRADA)
      for (std::int64_t i = 0; i < p.m; ++i) {
        double s = 0;
        for (std::int64_t l_ = 0; l_ < p.k; ++l_) s += op_a[static_cast<std::size_t>(i * p.k + l_)];
        store(l.vector_out, i, p.type, s);
      }
    if (p.epilogue == CUBLASLT_EPILOGUE_BGRADB)
      for (std::int64_t j = 0; j < p.n; ++j) {
        double s = 0;
        for (std::int64_t l_ = 0; l_ < p.k; ++l_) s += op_b[static_cast<std::size_t>(j * p.k + l_)];
        store(l.vector_out, j, p.type, s);
      }
  }
}

cublasStatus_t matmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t computeDesc, const void* alpha, const void* A,
                      cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                      const void* C, cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                      const cublasLtMatmulAlgo_t* algo, void* workspace, std::size_t workspaceSize,
                      cudaStream_t stream) {
  constexpr const char* call = "cublasLtMatmul";
  if (!handle || handle->magic != handle_magic)
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, text(call, ": the handle is null or not from cublasLtCreate"));
  const MatmulDesc* desc = desc_of(computeDesc);
  Launch l;
  if (auto rc = read_problem(call, desc, Adesc, Bdesc, Cdesc, Ddesc, l.p); rc != CUBLAS_STATUS_SUCCESS) return rc;
  Problem& p = l.p;
  if (!alpha || !beta) return refuse(CUBLAS_STATUS_INVALID_VALUE, text(call, ": alpha or beta is a null pointer"));
  l.alpha = *static_cast<const float*>(alpha);
  l.beta = *static_cast<const float*>(beta);
  if (applies_dgelu(p.epilogue) && l.beta != 0.0f)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, text(call, ": ", epilogue_name(p.epilogue), " with beta = ", l.beta,
                                                    " is not supported: the GELU gradient takes beta = 0"));
  l.a = A;
  l.b = B;
  l.c = C;
  l.d = D;
  if (p.vector == Vector::bias_in) l.vector_in = desc->bias;
  // The bias gradient goes where the bias pointer points (cuBLASLt has one vector pointer).
  if (p.vector == Vector::bias_grad) l.vector_out = const_cast<void*>(desc->bias);
  if (p.aux_written || p.aux_read) l.aux = desc->aux;

  // In place (C == D) reads and writes each element once, which needs one layout for both.
  if (l.beta != 0.0f && C == D && (p.c.ld != p.d.ld || (p.batch > 1 && p.c.stride != p.d.stride)))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, text(call, ": C and D are the same memory but their layouts differ: ",
                                                    describe("C", p.c), ", ", describe("D", p.d)));

  // The algorithm, if given, must be the heuristic's for this problem, and the pointers must have
  // the alignments promised to the heuristic.
  if (algo) {
    AlgoRecord r{};
    if (!decode(*algo, r))
      return refuse(CUBLAS_STATUS_INVALID_VALUE,
                    text(call, ": the algorithm did not come from cublasLtMatmulAlgoGetHeuristic"));
    if (r.epilogue != p.epilogue || r.type != p.type)
      return refuse(CUBLAS_STATUS_INVALID_VALUE,
                    text(call, ": the algorithm was chosen for ", epilogue_name(r.epilogue), " on ", type_name(r.type),
                         ", not for ", epilogue_name(p.epilogue), " on ", type_name(p.type)));
    const auto misaligned = [&](const char* name, const void* ptr, const Matrix* x, std::uint32_t need) -> std::string {
      if (!ptr || need <= 1) return {};
      const std::uint32_t have = alignment_of(ptr);
      const std::uint64_t step = x && x->batch > 1 ? static_cast<std::uint64_t>(x->stride) * p.bytes : 0;
      if (have >= need && step % need == 0) return {};
      const std::string where = have < need ? text(name, " at ", ptr, " is ", have, "-byte aligned")
                                            : text("the batch items of ", name, " are ", step, " bytes apart");
      return text(where, ", but the heuristic was promised ", need,
                  "-byte alignment (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, or the alignment of the bias or aux "
                  "pointer it saw)");
    };
    std::string why;
    for (auto&& w :
         {misaligned("A", A, &p.a, r.align_a), misaligned("B", B, &p.b, r.align_b),
          l.beta != 0.0f ? misaligned("C", C, &p.c, r.align_c) : std::string(), misaligned("D", D, &p.d, r.align_d),
          misaligned("the bias pointer", p.vector != Vector::none ? desc->bias : nullptr, nullptr, r.align_bias),
          misaligned("the aux pointer", l.aux, nullptr, r.align_aux)})
      if (why.empty()) why = w;
    if (!why.empty()) return refuse(CUBLAS_STATUS_INVALID_VALUE, text(call, ": ", why));
  }

  int device = -1;
  try {
    device = stream_device(stream);
  } catch (const std::exception& e) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, text(call, ": the stream is not valid: ", e.what()));
  }
  if (device < 0) return refuse(CUBLAS_STATUS_INVALID_VALUE, text(call, ": the stream is not valid"));
  l.device = device;

  // Memory: a GPU would fault on any of these; they are launch errors here.
  std::string why = check_ranges(l);
  if (why.empty() && workspaceSize > 0)
    why = check_range(text("the workspace (", workspaceSize, " bytes)"), workspace, workspaceSize, device);
  if (!why.empty()) {
    report_launch_error(cudaErrorInvalidValue, text(call, ": ", why));
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;

  enqueue(stream, call, [l] {
    // Memory freed between the call and the run would be an illegal access on a GPU.
    if (std::string gone = check_ranges(l); !gone.empty())
      throw DeviceFault{cudaErrorIllegalAddress, text("cublasLtMatmul: ", gone, " when the product ran")};
    run(l);
  });
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t heuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
                         cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                         cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                         cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  constexpr const char* call = "cublasLtMatmulAlgoGetHeuristic";
  if (!handle || handle->magic != handle_magic)
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, text(call, ": the handle is null or not from cublasLtCreate"));
  if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, text(call, ": requestedAlgoCount = ", requestedAlgoCount,
                                                    " (must be >= 1) or a null result pointer"));
  *returnAlgoCount = 0;
  const Preference* pref = preference_of(preference);
  if (!pref) return refuse(CUBLAS_STATUS_INVALID_VALUE, text(call, ": the preference is null or not one"));
  const MatmulDesc* desc = desc_of(operationDesc);
  Problem p;
  // Whatever the emulation cannot run, the heuristic has no algorithm for.
  if (read_problem(call, desc, Adesc, Bdesc, Cdesc, Ddesc, p) != CUBLAS_STATUS_SUCCESS)
    return CUBLAS_STATUS_NOT_SUPPORTED;

  if (pref->search_mode != CUBLASLT_SEARCH_BEST_FIT)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, text(call, ": CUBLASLT_MATMUL_PREF_SEARCH_MODE = ", pref->search_mode,
                                                    " is not supported: CUBLASLT_SEARCH_BEST_FIT only"));
  // The emulated algorithm: plain fused multiply-adds, no split-K reduction, no workspace, one wave.
  if ((pref->impl_mask & CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA) == 0)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, text(call, ": CUBLASLT_MATMUL_PREF_IMPL_MASK = ", pref->impl_mask,
                                                    " excludes CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA, the emulation's only "
                                                    "implementation"));
  if (pref->max_waves != 0.0f && pref->max_waves < 1.0f)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, text(call, ": CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT = ", pref->max_waves,
                                                    " excludes the emulation's algorithm (1 wave)"));
  // CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK filters split-K schemes; the algorithm uses none
  // (CUBLASLT_REDUCTION_SCHEME_NONE), which every mask admits. MAX_WORKSPACE_BYTES: it needs none.
  const auto element = static_cast<std::uint32_t>(p.bytes);
  for (const auto& [name, align] : {std::pair{"A", pref->align_a}, std::pair{"B", pref->align_b},
                                    std::pair{"C", pref->align_c}, std::pair{"D", pref->align_d}})
    if (align < element)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                    text(call, ": CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_", name, "_BYTES = ", align, " is less than the ",
                         element, "-byte elements: no algorithm reads unaligned elements"));

  AlgoRecord r{};
  r.align_a = required(pref->align_a);
  r.align_b = required(pref->align_b);
  r.align_c = required(pref->align_c);
  r.align_d = required(pref->align_d);
  // The heuristic reads the bias and aux pointers for their alignment, never their contents.
  r.align_bias = p.vector != Vector::none ? required(alignment_of(desc->bias)) : 1;
  r.align_aux = p.aux_written || p.aux_read ? required(alignment_of(desc->aux)) : 1;
  r.epilogue = p.epilogue;
  r.type = p.type;
  cublasLtMatmulHeuristicResult_t& result = heuristicResultsArray[0];
  result = cublasLtMatmulHeuristicResult_t{};
  result.algo = encode(r);
  result.workspaceSize = 0;
  result.state = CUBLAS_STATUS_SUCCESS;
  result.wavesCount = 1.0f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

/// A C entry point must not throw: an exception escaping the emulation becomes a status.
template <class F>
cublasStatus_t guarded(const char* call, F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return refuse(CUBLAS_STATUS_ALLOC_FAILED, text(call, ": out of host memory"));
  } catch (const std::exception& e) {
    return refuse(CUBLAS_STATUS_INTERNAL_ERROR, text(call, ": ", e.what()));
  }
}

}  // namespace
}  // namespace polyshard::emulation

using namespace polyshard::emulation;

extern "C" {

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (!lightHandle) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: the handle pointer is null");
  return guarded("cublasLtCreate", [&] {
    auto* h = new cublasLtContext;
    h->magic = handle_magic;
    h->device = current_device();
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
  });
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
  if (!lightHandle || lightHandle->magic != handle_magic)
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy: the handle is null or not from cublasLtCreate");
  lightHandle->magic = 0;
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) { return status_name(status); }

const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) { return status_string(status); }

size_t CUBLASWINAPI cublasLtGetVersion(void) { return CUBLAS_VERSION; }

size_t CUBLASWINAPI cublasLtGetCudartVersion(void) { return CUDART_VERSION; }

cublasStatus_t CUBLASWINAPI cublasLtGetProperty(libraryPropertyType type, int* value) {
  if (!value) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtGetProperty: the value pointer is null");
  switch (type) {
    case MAJOR_VERSION:
      *value = CUBLAS_VER_MAJOR;
      return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION:
      *value = CUBLAS_VER_MINOR;
      return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL:
      *value = CUBLAS_VER_PATCH;
      return CUBLAS_STATUS_SUCCESS;
  }
  return refuse(CUBLAS_STATUS_INVALID_VALUE, text("cublasLtGetProperty: property ", int(type), " is not one"));
}

// --- Matrix layouts ---

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t matLayout, size_t size,
                                                              cudaDataType type, uint64_t rows, uint64_t cols,
                                                              int64_t ld) {
  if (!matLayout || size < sizeof(Layout))
    return refuse(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtMatrixLayoutInit: the storage is null or too small");
  auto* l = new (matLayout) Layout{};
  l->magic = layout_magic;
  l->type = static_cast<std::uint32_t>(type);
  l->order = CUBLASLT_ORDER_COL;
  l->batch_count = 1;
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  l->batch_mode = CUBLASLT_BATCH_MODE_STRIDED;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                                       uint64_t rows, uint64_t cols, int64_t ld) {
  if (!matLayout) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate: the result pointer is null");
  return guarded("cublasLtMatrixLayoutCreate", [&] {
    auto* storage = new cublasLtMatrixLayoutOpaque_t{};
    cublasLtMatrixLayoutInit_internal(storage, sizeof(*storage), type, rows, cols, ld);
    *matLayout = storage;
    return CUBLAS_STATUS_SUCCESS;
  });
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  if (!matLayout) return CUBLAS_STATUS_SUCCESS;
  if (Layout* l = layout_of(matLayout)) l->magic = 0;
  delete matLayout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                                                             size_t sizeInBytes) {
  Layout* l = layout_of(matLayout);
  if (!l) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutSetAttribute: the layout is null or not one");
  return set_field("cublasLtMatrixLayoutSetAttribute", l, layout_fields, attr, buf, sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr, void* buf,
                                                             size_t sizeInBytes, size_t* sizeWritten) {
  const Layout* l = layout_of(matLayout);
  if (!l) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutGetAttribute: the layout is null or not one");
  return get_field("cublasLtMatrixLayoutGetAttribute", l, layout_fields, attr, buf, sizeInBytes, sizeWritten);
}

// --- Matmul descriptors ---

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t matmulDesc, size_t size,
                                                            cublasComputeType_t computeType, cudaDataType_t scaleType) {
  if (!matmulDesc || size < sizeof(MatmulDesc))
    return refuse(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtMatmulDescInit: the storage is null or too small");
  auto* d = new (matmulDesc) MatmulDesc{};
  d->magic = desc_magic;
  d->compute_type = computeType;
  d->scale_type = scaleType;
  d->pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  d->transa = d->transb = d->transc = CUBLAS_OP_N;
  d->fill_mode = CUBLAS_FILL_MODE_FULL;
  d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  d->aux_data_type = -1;
  d->bias_data_type = -1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType) {
  if (!matmulDesc) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate: the result pointer is null");
  return guarded("cublasLtMatmulDescCreate", [&] {
    auto* storage = new cublasLtMatmulDescOpaque_t{};
    cublasLtMatmulDescInit_internal(storage, sizeof(*storage), computeType, scaleType);
    *matmulDesc = storage;
    return CUBLAS_STATUS_SUCCESS;
  });
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  if (!matmulDesc) return CUBLAS_STATUS_SUCCESS;
  if (MatmulDesc* d = desc_of(matmulDesc)) d->magic = 0;
  delete matmulDesc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr, const void* buf,
                                                           size_t sizeInBytes) {
  MatmulDesc* d = desc_of(matmulDesc);
  if (!d)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescSetAttribute: the descriptor is null or not one");
  return set_field("cublasLtMatmulDescSetAttribute", d, desc_fields, attr, buf, sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr, void* buf,
                                                           size_t sizeInBytes, size_t* sizeWritten) {
  const MatmulDesc* d = desc_of(matmulDesc);
  if (!d)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescGetAttribute: the descriptor is null or not one");
  return get_field("cublasLtMatmulDescGetAttribute", d, desc_fields, attr, buf, sizeInBytes, sizeWritten);
}

// --- Preferences ---

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceInit_internal(cublasLtMatmulPreference_t pref, size_t size) {
  if (!pref || size < sizeof(Preference))
    return refuse(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtMatmulPreferenceInit: the storage is null or too small");
  auto* p = new (pref) Preference{};
  p->magic = preference_magic;
  p->search_mode = CUBLASLT_SEARCH_BEST_FIT;
  p->max_workspace = 0;
  p->reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
  p->align_a = p->align_b = p->align_c = p->align_d = 256;
  p->max_waves = 0.0f;
  p->impl_mask = ~std::uint64_t(0);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate: the result pointer is null");
  return guarded("cublasLtMatmulPreferenceCreate", [&] {
    auto* storage = new cublasLtMatmulPreferenceOpaque_t{};
    cublasLtMatmulPreferenceInit_internal(storage, sizeof(*storage));
    *pref = storage;
    return CUBLAS_STATUS_SUCCESS;
  });
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  if (!pref) return CUBLAS_STATUS_SUCCESS;
  if (Preference* p = preference_of(pref)) p->magic = 0;
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void* buf, size_t sizeInBytes) {
  Preference* p = preference_of(pref);
  if (!p)
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  "cublasLtMatmulPreferenceSetAttribute: the preference is null or not one");
  return set_field("cublasLtMatmulPreferenceSetAttribute", p, preference_fields, attr, buf, sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr, void* buf,
                                                                 size_t sizeInBytes, size_t* sizeWritten) {
  const Preference* p = preference_of(pref);
  if (!p)
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  "cublasLtMatmulPreferenceGetAttribute: the preference is null or not one");
  return get_field("cublasLtMatmulPreferenceGetAttribute", p, preference_fields, attr, buf, sizeInBytes, sizeWritten);
}

// --- Heuristic and product ---

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  return guarded("cublasLtMatmulAlgoGetHeuristic", [&] {
    return heuristic(lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, preference, requestedAlgoCount,
                     heuristicResultsArray, returnAlgoCount);
  });
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                           const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                                           const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                                           cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace,
                                           size_t workspaceSizeInBytes, cudaStream_t stream) {
  return guarded("cublasLtMatmul", [&] {
    return matmul(lightHandle, computeDesc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,
                  workspaceSizeInBytes, stream);
  });
}

}  // extern "C"
