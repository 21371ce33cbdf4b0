// The DLPack C exchange API (DLPack >= 1.2, exported by torch >= 2.9 as the PyCapsule
// torch.Tensor.__dlpack_c_exchange_api__): a C function that describes a tensor object as a
// DLTensor without creating Python objects. Going through __dlpack__ costs about 6 us per tensor
// (measured here, torch 2.13), three times a whole small seat call; this costs well under one.
//
// Only the members flashrt reads are declared, laid out as the DLPack specification fixes them.
#pragma once

#include <cstdint>

namespace frt::py::dl {

struct Version {
  uint32_t major, minor;
};
struct Device {
  int32_t device_type;  // 1 = CPU
  int32_t device_id;
};
struct DataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; NULL means compact row-major
  uint64_t byte_offset;
};
struct ExchangeApiHeader {
  Version version;
  ExchangeApiHeader* prev_api;
};
struct ExchangeApi {
  ExchangeApiHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, Tensor* out);  // may be NULL
  void* current_work_stream;
};

inline constexpr uint32_t kMajorVersion = 1;
inline constexpr int32_t kCpu = 1;
inline constexpr uint8_t kInt = 0;
inline constexpr uint8_t kFloat = 2;
inline constexpr uint8_t kBfloat = 4;
inline constexpr uint8_t kBool = 6;

}  // namespace frt::py::dl
