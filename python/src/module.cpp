// flashrt_structures._core: one file per core area binds it; bindings convert, call, convert
// back, and decide nothing.
#include <flashrt/errors.h>
#include <flashrt/utf8.h>
#include <nanobind/nanobind.h>

#include <exception>
#include <stdexcept>
#include <string>

namespace nb = nanobind;

namespace frt::py {
void bind_types(nb::module_& m);
namespace {

// Issue 13, the last line of defence (the core escapes where it quotes file content):
// PyErr_SetString decodes a message as UTF-8, so a message carrying a raw byte from a file or a
// path would surface as UnicodeDecodeError instead of the error it reports. Registered after
// the other translators, so nanobind tries it first; it acts only on such a message and throws
// the same kind of exception with the bytes escaped, which nanobind hands to the next
// translator to be mapped as usual.
void escape_invalid_message(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const nb::python_error&) {
    throw;  // already a Python exception
  } catch (const nb::builtin_exception&) {
    throw;  // nanobind's own messages
  } catch (const std::exception& e) {
    if (is_valid_utf8(e.what())) throw;
    const std::string msg = escape_invalid_utf8(e.what());
    // Most derived first: each keeps its own Python class.
    if (dynamic_cast<const Refused*>(&e)) throw Refused(msg);
    if (dynamic_cast<const KernelUnavailable*>(&e)) throw KernelUnavailable(msg);
    if (dynamic_cast<const InvalidArgument*>(&e)) throw InvalidArgument(msg);
    if (dynamic_cast<const std::invalid_argument*>(&e)) throw std::invalid_argument(msg);
    if (dynamic_cast<const std::domain_error*>(&e)) throw std::domain_error(msg);
    if (dynamic_cast<const std::length_error*>(&e)) throw std::length_error(msg);
    if (dynamic_cast<const std::out_of_range*>(&e)) throw std::out_of_range(msg);
    if (dynamic_cast<const std::range_error*>(&e)) throw std::range_error(msg);
    if (dynamic_cast<const std::overflow_error*>(&e)) throw std::overflow_error(msg);
    throw std::runtime_error(msg);
  }
}

}  // namespace

void bind_convert(nb::module_& m);
void bind_catalog(nb::module_& m);
void bind_hub(nb::module_& m);
void bind_quant(nb::module_& m);
void bind_ops(nb::module_& m);
void bind_planner(nb::module_& m);
void bind_runtime(nb::module_& m);
void bind_gates(nb::module_& m);
void bind_decode(nb::module_& m);
}  // namespace frt::py

NB_MODULE(_core, m) {
  m.doc() = "flashrt core: kernel path, packers and kernel ops";
  // The one translator: InvalidArgument -> ValueError (nanobind's default for
  // std::invalid_argument), Refused and KernelUnavailable -> their own classes.
  nb::exception<frt::Refused>(m, "Refused", PyExc_RuntimeError);
  nb::exception<frt::KernelUnavailable>(m, "KernelUnavailable", PyExc_ValueError);
  frt::py::bind_types(m);
  frt::py::bind_convert(m);
  frt::py::bind_catalog(m);
  frt::py::bind_hub(m);
  frt::py::bind_quant(m);
  frt::py::bind_ops(m);
  frt::py::bind_planner(m);
  frt::py::bind_runtime(m);
  frt::py::bind_gates(m);
  frt::py::bind_decode(m);
  // Last, so it runs before any translator a bind_* file registered (newest is tried first).
  nb::register_exception_translator(frt::py::escape_invalid_message);
}
