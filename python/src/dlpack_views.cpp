#include "dlpack_views.h"

#include <optional>

namespace fa3::python {
namespace {

// DLPack device types (dlpack.h, DLDeviceType).
constexpr int kDLCPU = 1;
constexpr int kDLCUDA = 2;
// DLPack type code of float8_e4m3fn (DLPack 1.1, DLDataTypeCode); spelled out so
// that nanobind releases that predate the fp8 codes still build.
constexpr std::uint8_t kDLFloat8E4M3FN = 10;

std::string device_string(int device_type, int device_id) {
  if (device_type == kDLCPU) return "cpu";
  if (device_type == kDLCUDA) return "cuda:" + std::to_string(device_id);
  return "DLPack device type " + std::to_string(device_type) + " (id " + std::to_string(device_id) + ")";
}

std::optional<DType> to_dtype(nb::dlpack::dtype t) {
  using Code = nb::dlpack::dtype_code;
  if (t.lanes != 1) return std::nullopt;
  if (t.code == static_cast<std::uint8_t>(Code::Float) && t.bits == 16) return DType::kFloat16;
  if (t.code == static_cast<std::uint8_t>(Code::Float) && t.bits == 32) return DType::kFloat32;
  if (t.code == static_cast<std::uint8_t>(Code::Bfloat) && t.bits == 16) return DType::kBFloat16;
  if (t.code == kDLFloat8E4M3FN && t.bits == 8) return DType::kFloat8E4M3;
  if (t.code == static_cast<std::uint8_t>(Code::Int) && t.bits == 32) return DType::kInt32;
  return std::nullopt;
}

std::string dtype_string(nb::dlpack::dtype t) {
  using Code = nb::dlpack::dtype_code;
  const char* kind = nullptr;
  switch (t.code) {
    case static_cast<std::uint8_t>(Code::Int):
      kind = "int";
      break;
    case static_cast<std::uint8_t>(Code::UInt):
      kind = "uint";
      break;
    case static_cast<std::uint8_t>(Code::Float):
      kind = "float";
      break;
    case static_cast<std::uint8_t>(Code::Bfloat):
      kind = "bfloat";
      break;
    case static_cast<std::uint8_t>(Code::Complex):
      kind = "complex";
      break;
    case static_cast<std::uint8_t>(Code::Bool):
      kind = "bool";
      break;
  }
  std::string s = kind ? kind + std::to_string(t.bits)
                       : "DLPack type code " + std::to_string(t.code) + " (" + std::to_string(t.bits) + " bits)";
  if (t.lanes != 1) s += " x" + std::to_string(t.lanes) + " lanes";
  return s;
}

}  // namespace

void Placement::check(const char* name, int device_type, int device_id) {
  if (!set_) {
    if (device_type != kDLCPU && device_type != kDLCUDA) {
      throw nb::value_error((std::string(name) + ": tensors on " + device_string(device_type, device_id) +
                             " are not supported; fa3 takes CPU or CUDA tensors")
                                .c_str());
    }
    set_ = true;
    device_type_ = device_type;
    device_id_ = device_type == kDLCPU ? 0 : device_id;
    first_name_ = name;
    return;
  }
  const bool same = device_type == device_type_ && (device_type == kDLCPU || device_id == device_id_);
  if (!same) {
    throw nb::value_error((std::string(name) + ": is on " + device_string(device_type, device_id) + " but " +
                           first_name_ + " is on " + describe() + "; all tensors of a call must be on one device")
                              .c_str());
  }
}

bool Placement::on_host() const { return set_ && device_type_ == kDLCPU; }
bool Placement::on_cuda() const { return set_ && device_type_ == kDLCUDA; }
std::string Placement::describe() const { return device_string(device_type_, device_id_); }

TensorView make_view(const char* name, nb::dlpack::dtype dtype, std::size_t ndim, const std::int64_t* shape,
                     const std::int64_t* stride, void* data, int device_type, int device_id, Placement& placement) {
  const std::string n = name;
  if (ndim > static_cast<std::size_t>(TensorView::kMaxRank)) {
    throw nb::value_error(
        (n + ": expected at most " + std::to_string(TensorView::kMaxRank) + " dimensions, got " + std::to_string(ndim))
            .c_str());
  }
  const std::optional<DType> dt = to_dtype(dtype);
  if (!dt) {
    throw nb::value_error(
        (n + ": element type " + dtype_string(dtype) +
         " is not supported; use float16, bfloat16, float32 or float8_e4m3fn (int32 for index tensors)")
            .c_str());
  }
  placement.check(name, device_type, device_id);

  TensorView v;
  v.data = data;
  v.dtype = *dt;
  v.rank = static_cast<int>(ndim);
  // DLPack allows a null stride array for a compact row-major tensor.
  std::int64_t row_major = 1;
  for (std::size_t d = ndim; d-- > 0;) {
    v.shape[d] = shape[d];
    v.stride[d] = stride ? stride[d] : row_major;
    row_major *= shape[d];
  }
  return v;
}

ByteBuffer to_bytes(const char* name, const OutArray& a, Placement& placement) {
  const std::string n = name;
  const nb::dlpack::dtype dtype = a.dtype();
  const bool is_uint8 =
      dtype.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt) && dtype.bits == 8 && dtype.lanes == 1;
  if (!is_uint8 || a.ndim() != 1) {
    throw nb::value_error(
        (n + ": expected a 1-d uint8 array, got a " + std::to_string(a.ndim()) + "-d " + dtype_string(dtype) + " array")
            .c_str());
  }
  // Elements one byte apart, so that the size in bytes is the element count.
  if (a.shape(0) > 1 && a.stride_ptr() && a.stride(0) != 1) {
    throw nb::value_error((n + ": must be contiguous, got stride " + std::to_string(a.stride(0))).c_str());
  }
  placement.check(name, a.device_type(), a.device_id());
  return {a.data(), a.shape(0)};
}

}  // namespace fa3::python
