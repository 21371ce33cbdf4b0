// The core's exception types. The C++ API throws these; the nanobind layer has one translator
// for them, and nothing of C++ crosses the kernel C ABI.
#pragma once

#include <stdexcept>
#include <string>

namespace frt {

// A caller error: wrong shape, dtype, layout or a bad argument. Python sees ValueError.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A form the layer declines on purpose; the message names the form and the shape.
class Refused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A kernel package could not be used on this machine (see KernelHub::unavailable_report()).
class KernelUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace frt
