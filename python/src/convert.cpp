#include "convert.h"

#include <flashrt/errors.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>  // describe() returns a std::string

#include <string>

#include "dlpack_exchange.h"

namespace frt::py {
namespace {

const dl::ExchangeApi* g_api = nullptr;
PyTypeObject* g_tensor_type = nullptr;

[[noreturn]] void refuse_device(const char* what, int device_type) {
  throw Refused(std::string(what) + ": tensor is on DLPack device type " +
                std::to_string(device_type) + ", kernels run on the CPU");
}

std::string dtype_text(uint8_t code, uint8_t bits, uint16_t lanes) {
  static const char* const kNames[] = {"int",    "uint",    "float", "opaque",
                                       "bfloat", "complex", "bool"};
  std::string name = code < 7 ? kNames[code] : "code" + std::to_string(code);
  name += std::to_string(bits);
  if (lanes != 1) name += "x" + std::to_string(lanes);
  return name;
}

// What a view may hold: activations and weights (f32, bf16), indices (a router's int64 ids), or
// an attention mask (bool, or f32 or bf16 added to the scores).
enum class Holds { values, indices, mask };

DType dtype_of(uint8_t code, uint8_t bits, uint16_t lanes, const char* what, Holds holds) {
  if (holds == Holds::mask) {
    if (lanes == 1 && bits == 8 && code == dl::kBool) return DType::boolean;
    if (lanes == 1 && bits == 32 && code == dl::kFloat) return DType::f32;
    if (lanes == 1 && bits == 16 && code == dl::kBfloat) return DType::bf16;
    throw Refused(std::string(what) + ": dtype " + dtype_text(code, bits, lanes) +
                  "; supported: bool, float32, bfloat16");
  }
  if (holds == Holds::indices) {
    if (lanes == 1 && bits == 64 && code == dl::kInt) return DType::i64;
    if (lanes == 1 && bits == 32 && code == dl::kInt) return DType::i32;
    throw Refused(std::string(what) + ": dtype " + dtype_text(code, bits, lanes) +
                  "; supported: int64, int32");
  }
  if (lanes == 1 && bits == 32 && code == dl::kFloat) return DType::f32;
  if (lanes == 1 && bits == 16 && code == dl::kBfloat) return DType::bf16;
  throw Refused(std::string(what) + ": dtype " + dtype_text(code, bits, lanes) +
                "; supported: float32, bfloat16");
}

void check_rank(int64_t ndim, const char* what) {
  if (ndim > 4) throw Refused(std::string(what) + ": rank " + std::to_string(ndim) + " > 4");
}

TensorView from_exchange(nb::handle obj, const char* what, Holds holds) {
  dl::Tensor t{};
  if (g_api->dltensor_from_py_object_no_sync(obj.ptr(), &t) != 0) {
    // torch cannot describe it (a meta tensor, say): refuse with the first line of its reason.
    nb::python_error err;
    std::string reason = err.what();
    reason = reason.substr(0, reason.find('\n'));
    throw Refused(std::string(what) + ": not viewable as a CPU tensor (" + reason + ")");
  }
  if (t.device.device_type != dl::kCpu) refuse_device(what, t.device.device_type);
  TensorView v;
  v.dtype = dtype_of(t.dtype.code, t.dtype.bits, t.dtype.lanes, what, holds);
  check_rank(t.ndim, what);
  v.rank = t.ndim;
  int64_t compact = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.shape[i] = t.shape[i];
    v.strides[i] = t.strides != nullptr ? t.strides[i] : compact;
    compact *= t.shape[i];
  }
  v.data = static_cast<char*>(t.data) + t.byte_offset;
  return v;
}

TensorView from_ndarray(nb::handle obj, const char* what, Holds holds) {
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(obj, a, /*convert=*/false))
    throw Refused(std::string(what) + ": " + nb::inst_name(obj).c_str() + " is not a tensor");
  if (a.device_type() != nb::device::cpu::value) refuse_device(what, a.device_type());
  TensorView v;
  v.dtype = dtype_of(a.dtype().code, a.dtype().bits, a.dtype().lanes, what, holds);
  check_rank(static_cast<int64_t>(a.ndim()), what);
  v.rank = static_cast<int>(a.ndim());
  for (int i = 0; i < v.rank; ++i) {
    v.shape[i] = static_cast<int64_t>(a.shape(i));
    v.strides[i] = static_cast<int64_t>(a.stride(i));
  }
  v.data = const_cast<void*>(a.data());
  return v;
}

}  // namespace

TensorView view_of(nb::handle obj, const char* what) {
  if (g_api != nullptr && PyObject_TypeCheck(obj.ptr(), g_tensor_type))
    return from_exchange(obj, what, Holds::values);
  return from_ndarray(obj, what, Holds::values);
}

TensorView index_view_of(nb::handle obj, const char* what) {
  if (g_api != nullptr && PyObject_TypeCheck(obj.ptr(), g_tensor_type))
    return from_exchange(obj, what, Holds::indices);
  return from_ndarray(obj, what, Holds::indices);
}

TensorView mask_view_of(nb::handle obj, const char* what) {
  if (g_api != nullptr && PyObject_TypeCheck(obj.ptr(), g_tensor_type))
    return from_exchange(obj, what, Holds::mask);
  return from_ndarray(obj, what, Holds::mask);
}

bool use_dlpack_exchange(nb::handle tensor_type) {
  if (!PyType_Check(tensor_type.ptr()) || !nb::hasattr(tensor_type, "__dlpack_c_exchange_api__"))
    return false;
  nb::object capsule = tensor_type.attr("__dlpack_c_exchange_api__");
  void* p = PyCapsule_GetPointer(capsule.ptr(), "dlpack_exchange_api");
  if (p == nullptr) {
    PyErr_Clear();
    return false;
  }
  const auto* api = static_cast<const dl::ExchangeApi*>(p);
  if (api->header.version.major != dl::kMajorVersion ||
      api->dltensor_from_py_object_no_sync == nullptr)
    return false;
  Py_INCREF(tensor_type.ptr());  // kept for the process, like the API it came with
  g_tensor_type = reinterpret_cast<PyTypeObject*>(tensor_type.ptr());
  g_api = api;
  return true;
}

void bind_convert(nb::module_& m) {
  m.def("use_dlpack_exchange", &use_dlpack_exchange, nb::arg("tensor_type"));
  m.def(
      "describe", [](nb::handle t) { return view_of(t, "tensor").describe(); }, nb::arg("t"));
}

}  // namespace frt::py
