// vkc_runtime._native: low-overhead launcher for Triton cubins; the owner of the launch ABI on the launch path
// (vkc_runtime/pack.py is its Python twin: the fallback and the tests' oracle; change both together).
//
// Builds without CUDA headers or libraries: the few driver types and prototypes used here are declared
// below with the layout of cuda.h (CUDA 12.x / 13.x), and libcuda.so.1 is dlopen'ed lazily on the first
// launch (env VKC_LIBCUDA overrides the library path; the CPU tests point it at a fake driver).
//
// Packing contract (identical to vkc_runtime.pack.pack_args): parameters are laid out in order, each
// at an offset aligned to its own size (1, 2, 4 or 8 bytes), padding bytes are zero; the void*[] handed
// to the driver points at each parameter. Codes are those of vkc_contract.abi:
//   p pointer (int or None -> 8 bytes)   ? i1 (1 byte, 0/1)   b/B i8/u8   h/H i16/u16   i/I i32/u32
//   q/Q i64/u64   e fp16 (PyFloat_Pack2, round to nearest even)   E bf16 (float32 bits rounded to nearest
//   even, NaN kept quiet)   f fp32 (4 bytes)   d fp64.
// Wrong Python types raise TypeError, out-of-range values ValueError; both name the parameter.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dlfcn.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace py = pybind11;

// ----------------------------------------------------------------------------------- CUDA driver subset
extern "C" {
typedef int CUresult;  // enum cudaError_enum; CUDA_SUCCESS == 0
typedef struct CUctx_st* CUcontext;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;
typedef int CUlaunchAttributeID;  // enum CUlaunchAttributeID_enum (4 bytes)

typedef union VkcLaunchAttributeValue {
    char pad[64];
    void* align_ptr_;               // the real union holds pointers (access policy window, events): align 8
    unsigned long long align_u64_;
    int cooperative;
    struct {
        unsigned int x;
        unsigned int y;
        unsigned int z;
    } clusterDim;
    int clusterSchedulingPolicyPreference;
    int programmaticStreamSerializationAllowed;
} VkcLaunchAttributeValue;

typedef struct VkcLaunchAttribute {
    CUlaunchAttributeID id;
    char pad[8 - sizeof(CUlaunchAttributeID)];
    VkcLaunchAttributeValue value;
} VkcLaunchAttribute;

typedef struct VkcLaunchConfig {
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    VkcLaunchAttribute* attrs;
    unsigned int numAttrs;
} VkcLaunchConfig;

typedef CUresult (*PFN_cuLaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                                       unsigned int, unsigned int, unsigned int, CUstream, void**, void**);
typedef CUresult (*PFN_cuLaunchKernelEx)(const VkcLaunchConfig*, CUfunction, void**, void**);
typedef CUresult (*PFN_cuGetErrorName)(CUresult, const char**);
typedef CUresult (*PFN_cuCtxGetCurrent)(CUcontext*);
}

static_assert(sizeof(VkcLaunchAttributeValue) == 64, "CUlaunchAttributeValue is 64 bytes");
static_assert(alignof(VkcLaunchAttributeValue) == 8, "CUlaunchAttributeValue is 8-aligned");
static_assert(offsetof(VkcLaunchAttribute, value) == 8, "CUlaunchAttribute::value at offset 8");
static_assert(sizeof(VkcLaunchAttribute) == 72, "CUlaunchAttribute is 72 bytes");
static_assert(offsetof(VkcLaunchConfig, sharedMemBytes) == 24, "CUlaunchConfig layout");
static_assert(offsetof(VkcLaunchConfig, hStream) == 32, "CUlaunchConfig layout");
static_assert(offsetof(VkcLaunchConfig, attrs) == 40, "CUlaunchConfig layout");
static_assert(offsetof(VkcLaunchConfig, numAttrs) == 48, "CUlaunchConfig layout");
static_assert(sizeof(VkcLaunchConfig) == 56, "CUlaunchConfig is 56 bytes");

// CUlaunchAttributeID values (cuda.h; checked against cuda-bindings 13.5 in the tests)
enum : int {
    VKC_ATTR_COOPERATIVE = 2,
    VKC_ATTR_CLUSTER_DIMENSION = 4,
    VKC_ATTR_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5,
    VKC_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6,
};
enum : int { VKC_CLUSTER_SCHEDULING_POLICY_SPREAD = 1 };

// ----------------------------------------------------------------------------------- lazy libcuda
namespace {

struct Driver {
    bool tried = false;
    void* handle = nullptr;
    PFN_cuLaunchKernel launch = nullptr;
    PFN_cuLaunchKernelEx launch_ex = nullptr;
    PFN_cuGetErrorName error_name = nullptr;
    PFN_cuCtxGetCurrent ctx_current = nullptr;
    std::string error;
    std::string path;
};

Driver g_drv;  // guarded by the GIL

// The exception types vkc_runtime registers (CudaError, LaunchError); fall back to builtins.
PyObject* g_cuda_error = nullptr;
PyObject* g_launch_error = nullptr;

bool load_driver() {
    if (g_drv.tried) return g_drv.launch != nullptr;
    g_drv.tried = true;
    const char* env = std::getenv("VKC_LIBCUDA");
    g_drv.path = (env && *env) ? env : "libcuda.so.1";
    g_drv.handle = dlopen(g_drv.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!g_drv.handle) {
        const char* e = dlerror();
        g_drv.error = std::string("cannot load ") + g_drv.path + ": " + (e ? e : "unknown dlopen error");
        return false;
    }
    g_drv.launch = reinterpret_cast<PFN_cuLaunchKernel>(dlsym(g_drv.handle, "cuLaunchKernel"));
    g_drv.launch_ex = reinterpret_cast<PFN_cuLaunchKernelEx>(dlsym(g_drv.handle, "cuLaunchKernelEx"));
    g_drv.error_name = reinterpret_cast<PFN_cuGetErrorName>(dlsym(g_drv.handle, "cuGetErrorName"));
    g_drv.ctx_current = reinterpret_cast<PFN_cuCtxGetCurrent>(dlsym(g_drv.handle, "cuCtxGetCurrent"));
    if (!g_drv.launch) {
        g_drv.error = g_drv.path + " has no cuLaunchKernel";
        return false;
    }
    return true;
}

std::string error_name(CUresult r) {
    const char* s = nullptr;
    if (g_drv.error_name && g_drv.error_name(r, &s) == 0 && s) return std::string(s);
    return "CUDA_ERROR_" + std::to_string(r);
}

[[noreturn]] void raise_cuda(const char* call, CUresult r, const std::string& detail) {
    std::string name = error_name(r);
    if (g_cuda_error) {  // vkc_runtime.errors.CudaError(name, code, call, detail)
        PyObject* exc = PyObject_CallFunction(g_cuda_error, "siss", name.c_str(), (int)r, call, detail.c_str());
        if (exc) {
            PyErr_SetObject(g_cuda_error, exc);
            Py_DECREF(exc);
        }
        throw py::error_already_set();
    }
    std::string msg = std::string(call) + ": " + name + " (" + std::to_string(r) + "): " + detail;
    PyErr_SetString(PyExc_RuntimeError, msg.c_str());
    throw py::error_already_set();
}

[[noreturn]] void raise_launch_error(const std::string& msg) {
    PyErr_SetString(g_launch_error ? g_launch_error : PyExc_ValueError, msg.c_str());
    throw py::error_already_set();
}

// ----------------------------------------------------------------------------------- packing
constexpr int kMaxParams = 256;
constexpr size_t kMaxParamBytes = 4096;  // the classic kernel parameter limit; plenty for Triton kernels

int code_size(char c) {
    switch (c) {
        case 'p': case 'q': case 'Q': case 'd': return 8;
        case 'i': case 'I': case 'f': return 4;
        case 'h': case 'H': case 'e': case 'E': return 2;
        case '?': case 'b': case 'B': return 1;
        default: return 0;
    }
}

const char* code_ctype(char c) {
    switch (c) {
        case 'p': return "pointer";
        case '?': return "i1";
        case 'b': return "i8";
        case 'B': return "u8";
        case 'h': return "i16";
        case 'H': return "u16";
        case 'i': return "i32";
        case 'I': return "u32";
        case 'q': return "i64";
        case 'Q': return "u64";
        case 'e': return "fp16";
        case 'E': return "bf16";
        case 'f': return "fp32";
        case 'd': return "fp64";
        default: return "?";
    }
}

struct Layout {
    std::vector<uint32_t> offsets;
    size_t total = 0;
};

Layout make_layout(const std::string& codes) {
    if (codes.size() > (size_t)kMaxParams)
        throw py::value_error("too many kernel parameters: " + std::to_string(codes.size()) + " > " +
                              std::to_string(kMaxParams));
    Layout L;
    size_t off = 0;
    for (char c : codes) {
        int s = code_size(c);
        if (!s) throw py::value_error(std::string("unknown pack code '") + c + "'");
        off = (off + (size_t)s - 1) / (size_t)s * (size_t)s;
        L.offsets.push_back((uint32_t)off);
        off += (size_t)s;
    }
    L.total = off;
    if (L.total > kMaxParamBytes)
        throw py::value_error("kernel parameters take " + std::to_string(L.total) + " bytes > " +
                              std::to_string(kMaxParamBytes));
    return L;
}

struct ArgCtx {
    const char* kernel;      // for messages
    const std::string* name; // parameter name
};

std::string describe(const ArgCtx& a) {
    std::string s = std::string(a.kernel) + ": argument '" + *a.name + "'";
    return s;
}

std::string type_name(PyObject* v) { return Py_TYPE(v)->tp_name; }

// Read a Python integer (int or __index__). On success: *neg says whether it is negative, *mag holds
// the two's-complement 64-bit value when it fits in [-2^63, 2^64); *big is set when it does not.
bool read_int(PyObject* v, const ArgCtx& a, char code, long long* sv, unsigned long long* uv, bool* fits_s,
              bool* fits_u) {
    PyObject* obj = v;
    PyObject* tmp = nullptr;
    if (!PyLong_Check(v)) {
        if (PyFloat_Check(v) || !Py_TYPE(v)->tp_as_number || !Py_TYPE(v)->tp_as_number->nb_index) {
            std::string msg = describe(a) + " (" + code_ctype(code) + ") expects an int, got " + type_name(v);
            PyErr_SetString(PyExc_TypeError, msg.c_str());
            return false;
        }
        tmp = PyNumber_Index(v);
        if (!tmp) return false;
        obj = tmp;
    }
    int overflow = 0;
    long long s = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (s == -1 && PyErr_Occurred()) {
        Py_XDECREF(tmp);
        return false;
    }
    *fits_s = overflow == 0;
    *fits_u = false;
    *sv = s;
    *uv = 0;
    if (overflow == 0) {
        if (s >= 0) {
            *fits_u = true;
            *uv = (unsigned long long)s;
        }
    } else if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(obj);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();  // >= 2^64
        } else {
            *fits_u = true;
            *uv = u;
        }
    }
    Py_XDECREF(tmp);
    return true;
}

std::string repr_of(PyObject* v) {
    PyObject* r = PyObject_Repr(v);
    if (!r) {
        PyErr_Clear();
        return "<?>";
    }
    const char* s = PyUnicode_AsUTF8(r);
    std::string out = s ? s : "<?>";
    Py_DECREF(r);
    return out;
}

bool range_error(PyObject* v, const ArgCtx& a, char code) {
    std::string msg = describe(a) + " = " + repr_of(v) + " is out of range for " + code_ctype(code);
    PyErr_SetString(PyExc_ValueError, msg.c_str());
    return false;
}

inline uint16_t bf16_bits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x0040u);  // NaN: keep sign, quiet
    b += 0x7fffu + ((b >> 16) & 1u);                                                 // round to nearest even
    return (uint16_t)(b >> 16);
}

bool read_double(PyObject* v, const ArgCtx& a, char code, double* out) {
    if (PyFloat_CheckExact(v)) {
        *out = PyFloat_AS_DOUBLE(v);
        return true;
    }
    if (PyUnicode_Check(v) || PyBytes_Check(v) || PyByteArray_Check(v)) {
        std::string msg = describe(a) + " (" + code_ctype(code) + ") expects a float, got " + type_name(v);
        PyErr_SetString(PyExc_TypeError, msg.c_str());
        return false;
    }
    double d = PyFloat_AsDouble(v);
    if (d == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {  // an int too large for a double
            PyErr_Clear();
            return range_error(v, a, code);
        }
        PyErr_Clear();
        std::string msg = describe(a) + " (" + code_ctype(code) + ") expects a float, got " + type_name(v);
        PyErr_SetString(PyExc_TypeError, msg.c_str());
        return false;
    }
    *out = d;
    return true;
}

bool to_float32(double d, PyObject* v, const ArgCtx& a, char code, float* out) {
    float f = (float)d;
    if (std::isinf(f) && !std::isinf(d)) return range_error(v, a, code);
    *out = f;
    return true;
}

// Pack one value at dst (already aligned). div: 16 -> value % 16 must be 0 (pointers and ints).
bool pack_one(char code, PyObject* v, char* dst, const ArgCtx& a, int div) {
    long long sv = 0;
    unsigned long long uv = 0;
    bool fs = false, fu = false;
    switch (code) {
        case 'p': {
            if (v == Py_None) {
                uv = 0;
            } else {
                if (!read_int(v, a, code, &sv, &uv, &fs, &fu)) return false;
                if (!fu) return range_error(v, a, code);
            }
            if (div > 1 && (uv % (unsigned long long)div) != 0) {
                char buf[64];
                std::snprintf(buf, sizeof buf, "0x%llx", uv);
                std::string msg = describe(a) + " = " + buf + " is not " + std::to_string(div) +
                                  "-byte aligned, but this kernel specialization was compiled for " +
                                  std::to_string(div) + "-aligned pointers (tt.divisibility=" + std::to_string(div) + ")";
                PyErr_SetString(PyExc_ValueError, msg.c_str());
                return false;
            }
            std::memcpy(dst, &uv, 8);
            return true;
        }
        case '?': {
            if (!read_int(v, a, code, &sv, &uv, &fs, &fu)) return false;
            uint8_t b = (fs ? sv != 0 : true) ? 1 : 0;
            std::memcpy(dst, &b, 1);
            return true;
        }
        case 'b': case 'h': case 'i': case 'q': {
            if (!read_int(v, a, code, &sv, &uv, &fs, &fu)) return false;
            if (!fs) return range_error(v, a, code);
            long long lo, hi;
            switch (code) {
                case 'b': lo = INT8_MIN; hi = INT8_MAX; break;
                case 'h': lo = INT16_MIN; hi = INT16_MAX; break;
                case 'i': lo = INT32_MIN; hi = INT32_MAX; break;
                default: lo = INT64_MIN; hi = INT64_MAX; break;
            }
            if (sv < lo || sv > hi) return range_error(v, a, code);
            if (div > 1 && (sv % div) != 0) {
                std::string msg = describe(a) + " = " + std::to_string(sv) + " is not a multiple of " +
                                  std::to_string(div) + ", but this kernel specialization was compiled for multiples of " +
                                  std::to_string(div) + " (tt.divisibility=" + std::to_string(div) + ")";
                PyErr_SetString(PyExc_ValueError, msg.c_str());
                return false;
            }
            if (code == 'b') { int8_t x = (int8_t)sv; std::memcpy(dst, &x, 1); }
            else if (code == 'h') { int16_t x = (int16_t)sv; std::memcpy(dst, &x, 2); }
            else if (code == 'i') { int32_t x = (int32_t)sv; std::memcpy(dst, &x, 4); }
            else { int64_t x = (int64_t)sv; std::memcpy(dst, &x, 8); }
            return true;
        }
        case 'B': case 'H': case 'I': case 'Q': {
            if (!read_int(v, a, code, &sv, &uv, &fs, &fu)) return false;
            if (!fu) return range_error(v, a, code);
            unsigned long long hi = code == 'B' ? 0xffull : code == 'H' ? 0xffffull : code == 'I' ? 0xffffffffull
                                                                                                    : ~0ull;
            if (uv > hi) return range_error(v, a, code);
            if (div > 1 && (uv % (unsigned long long)div) != 0) {
                std::string msg = describe(a) + " = " + std::to_string(uv) + " is not a multiple of " +
                                  std::to_string(div) + " (tt.divisibility=" + std::to_string(div) + ")";
                PyErr_SetString(PyExc_ValueError, msg.c_str());
                return false;
            }
            if (code == 'B') { uint8_t x = (uint8_t)uv; std::memcpy(dst, &x, 1); }
            else if (code == 'H') { uint16_t x = (uint16_t)uv; std::memcpy(dst, &x, 2); }
            else if (code == 'I') { uint32_t x = (uint32_t)uv; std::memcpy(dst, &x, 4); }
            else { uint64_t x = (uint64_t)uv; std::memcpy(dst, &x, 8); }
            return true;
        }
        case 'e': {
            double d = 0.0;
            if (!read_double(v, a, code, &d)) return false;
#if PY_VERSION_HEX >= 0x030B0000
            if (PyFloat_Pack2(d, dst, 1) < 0) {
#else
            if (_PyFloat_Pack2(d, (unsigned char*)dst, 1) < 0) {
#endif
                PyErr_Clear();
                return range_error(v, a, code);
            }
            return true;
        }
        case 'E': {
            double d = 0.0;
            float f = 0.0f;
            if (!read_double(v, a, code, &d) || !to_float32(d, v, a, code, &f)) return false;
            uint16_t h = bf16_bits(f);
            std::memcpy(dst, &h, 2);
            return true;
        }
        case 'f': {
            double d = 0.0;
            float f = 0.0f;
            if (!read_double(v, a, code, &d) || !to_float32(d, v, a, code, &f)) return false;
            std::memcpy(dst, &f, 4);
            return true;
        }
        case 'd': {
            double d = 0.0;
            if (!read_double(v, a, code, &d)) return false;
            std::memcpy(dst, &d, 8);
            return true;
        }
        default: {
            std::string msg = describe(a) + ": unknown pack code";
            PyErr_SetString(PyExc_ValueError, msg.c_str());
            return false;
        }
    }
}

// ----------------------------------------------------------------------------------- Launcher
class Launcher {
  public:
    Launcher(unsigned long long function, std::string codes, std::vector<std::string> names, std::vector<int> divisibility,
             int n_hidden, unsigned int block_x, unsigned int shared, unsigned int num_ctas, bool pdl, bool cooperative,
             std::string kernel_name)
        : fn_(reinterpret_cast<CUfunction>((uintptr_t)function)), codes_(std::move(codes)), names_(std::move(names)),
          div_(std::move(divisibility)), block_x_(block_x), shared_(shared), num_ctas_(num_ctas), pdl_(pdl),
          coop_(cooperative), name_(std::move(kernel_name)) {
        layout_ = make_layout(codes_);
        if (names_.size() != codes_.size() || div_.size() != codes_.size())
            throw py::value_error("codes, names and divisibility must have the same length");
        if (n_hidden < 0 || (size_t)n_hidden > codes_.size()) throw py::value_error("bad n_hidden");
        for (size_t i = codes_.size() - (size_t)n_hidden; i < codes_.size(); ++i)
            if (codes_[i] != 'p') throw py::value_error("hidden parameters must be pointers");
        n_visible_ = (int)codes_.size() - n_hidden;
        if (block_x_ == 0 || block_x_ > 1024) throw py::value_error("block_x must be in 1..1024");
        if (num_ctas_ == 0) throw py::value_error("num_ctas must be >= 1");
        n_attrs_ = 0;
        std::memset(attrs_, 0, sizeof attrs_);
        if (num_ctas_ > 1) {
            attrs_[n_attrs_].id = VKC_ATTR_CLUSTER_DIMENSION;
            attrs_[n_attrs_].value.clusterDim.x = num_ctas_;
            attrs_[n_attrs_].value.clusterDim.y = 1;
            attrs_[n_attrs_].value.clusterDim.z = 1;
            ++n_attrs_;
            attrs_[n_attrs_].id = VKC_ATTR_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
            attrs_[n_attrs_].value.clusterSchedulingPolicyPreference = VKC_CLUSTER_SCHEDULING_POLICY_SPREAD;
            ++n_attrs_;
        }
        if (pdl_) {
            attrs_[n_attrs_].id = VKC_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION;
            attrs_[n_attrs_].value.programmaticStreamSerializationAllowed = 1;
            ++n_attrs_;
        }
        if (coop_) {
            attrs_[n_attrs_].id = VKC_ATTR_COOPERATIVE;
            attrs_[n_attrs_].value.cooperative = 1;
            ++n_attrs_;
        }
    }

    void launch(long long gx, long long gy, long long gz, unsigned long long stream, py::handle args_h,
                unsigned long long scratch) {
        check_grid(gx, gy, gz);
        alignas(16) char buf[kMaxParamBytes];
        pack_params(args_h.ptr(), scratch, buf);
        if (gx == 0 || gy == 0 || gz == 0) return;  // empty grid: nothing to launch (as Triton)
        launch_packed(gx, gy, gz, stream, buf);
    }

    // Visible args (a tuple, checked like every launch) + the hidden scratch pointers -> buf (layout_.total
    // bytes, padding zeroed). Raises (error_already_set) with the parameter named.
    void pack_params(PyObject* args, unsigned long long scratch, char* buf) const {
        if (!PyTuple_Check(args)) {
            std::string msg = name_ + ": args must be a tuple, got " + type_name(args);
            PyErr_SetString(PyExc_TypeError, msg.c_str());
            throw py::error_already_set();
        }
        Py_ssize_t n = PyTuple_GET_SIZE(args);
        if (n != n_visible_) {
            std::string msg = name_ + " takes " + std::to_string(n_visible_) + " arguments (";
            for (int i = 0; i < n_visible_; ++i) msg += (i ? ", " : "") + names_[(size_t)i];
            msg += "), got " + std::to_string(n);
            PyErr_SetString(PyExc_TypeError, msg.c_str());
            throw py::error_already_set();
        }
        std::memset(buf, 0, layout_.total);
        for (int i = 0; i < n_visible_; ++i) {
            ArgCtx a{name_.c_str(), &names_[(size_t)i]};
            if (!pack_one(codes_[(size_t)i], PyTuple_GET_ITEM(args, i), buf + layout_.offsets[(size_t)i], a,
                          div_[(size_t)i]))
                throw py::error_already_set();
        }
        for (size_t i = (size_t)n_visible_; i < codes_.size(); ++i) {
            unsigned long long v = (i == (size_t)n_visible_) ? scratch : 0ull;  // global_scratch, then profile
            std::memcpy(buf + layout_.offsets[i], &v, 8);
        }
    }

    void check_grid(long long gx, long long gy, long long gz) const {
        if (gx < 0 || gy < 0 || gz < 0)
            raise_launch_error(name_ + ": negative grid (" + std::to_string(gx) + ", " + std::to_string(gy) + ", " +
                               std::to_string(gz) + ")");
        if ((unsigned long long)gx * num_ctas_ > 0x7fffffffull || gy > 65535 || gz > 65535)
            raise_launch_error(name_ + ": grid (" + std::to_string(gx) + ", " + std::to_string(gy) + ", " +
                               std::to_string(gz) + ") x num_ctas " + std::to_string(num_ctas_) +
                               " exceeds the CUDA limits (x*num_ctas < 2^31, y <= 65535, z <= 65535)");
    }

    // Launch a packed parameter buffer (pack_params' layout) on a checked, non-empty grid.
    void launch_packed(long long gx, long long gy, long long gz, unsigned long long stream, char* buf) const {
        void* ptrs[kMaxParams];
        for (size_t i = 0; i < codes_.size(); ++i) ptrs[i] = buf + layout_.offsets[i];
        if (!g_drv.launch && !load_driver()) {
            std::string msg = "vkc native launcher: " + g_drv.error;
            PyErr_SetString(PyExc_RuntimeError, msg.c_str());
            throw py::error_already_set();
        }
        CUresult r;
        const char* call;
        if (n_attrs_ == 0) {
            call = "cuLaunchKernel";
            PFN_cuLaunchKernel f = g_drv.launch;
            Py_BEGIN_ALLOW_THREADS
            r = f(fn_, (unsigned int)(gx * num_ctas_), (unsigned int)gy, (unsigned int)gz, block_x_, 1, 1, shared_,
                  reinterpret_cast<CUstream>((uintptr_t)stream), ptrs, nullptr);
            Py_END_ALLOW_THREADS
        } else {
            call = "cuLaunchKernelEx";
            if (!g_drv.launch_ex) {
                std::string msg = name_ + " needs cuLaunchKernelEx (clusters/PDL/cooperative), which " + g_drv.path +
                                  " does not export (driver older than CUDA 12.0?)";
                PyErr_SetString(PyExc_RuntimeError, msg.c_str());
                throw py::error_already_set();
            }
            VkcLaunchAttribute attrs[4];
            std::memcpy(attrs, attrs_, sizeof attrs);
            VkcLaunchConfig cfg;
            std::memset(&cfg, 0, sizeof cfg);
            cfg.gridDimX = (unsigned int)(gx * num_ctas_);
            cfg.gridDimY = (unsigned int)gy;
            cfg.gridDimZ = (unsigned int)gz;
            cfg.blockDimX = block_x_;
            cfg.blockDimY = 1;
            cfg.blockDimZ = 1;
            cfg.sharedMemBytes = shared_;
            cfg.hStream = reinterpret_cast<CUstream>((uintptr_t)stream);
            cfg.attrs = attrs;
            cfg.numAttrs = (unsigned int)n_attrs_;
            PFN_cuLaunchKernelEx f = g_drv.launch_ex;
            Py_BEGIN_ALLOW_THREADS
            r = f(&cfg, fn_, ptrs, nullptr);
            Py_END_ALLOW_THREADS
        }
        if (r != 0) {
            char sbuf[32];
            std::snprintf(sbuf, sizeof sbuf, "0x%llx", stream);
            raise_cuda(call, r, "kernel " + name_ + " grid=(" + std::to_string(gx) + ", " + std::to_string(gy) + ", " +
                                    std::to_string(gz) + ") num_ctas=" + std::to_string(num_ctas_) + " block=" +
                                    std::to_string(block_x_) + " shared=" + std::to_string(shared_) + " stream=" + sbuf);
        }
    }

    // Offset of visible parameter i and its pack code (BoundCall patches pointers there).
    uint32_t offset(size_t i) const { return layout_.offsets[i]; }
    char code(size_t i) const { return codes_[i]; }
    int divisibility(size_t i) const { return div_[i]; }

    const std::string& name() const { return name_; }
    const std::string& codes() const { return codes_; }
    int n_visible() const { return n_visible_; }
    unsigned int block_x() const { return block_x_; }
    unsigned int shared() const { return shared_; }
    unsigned int num_ctas() const { return num_ctas_; }
    bool uses_ex() const { return n_attrs_ > 0; }
    unsigned long long function() const { return (unsigned long long)(uintptr_t)fn_; }
    size_t param_bytes() const { return layout_.total; }

  private:
    CUfunction fn_;
    std::string codes_;
    std::vector<std::string> names_;
    std::vector<int> div_;
    unsigned int block_x_, shared_, num_ctas_;
    bool pdl_, coop_;
    std::string name_;
    Layout layout_;
    int n_visible_ = 0;
    VkcLaunchAttribute attrs_[4];
    int n_attrs_ = 0;
};

// ----------------------------------------------------------------------------------- BoundCall
// A call an op validated once, replayed while every fact its validation read still holds
// (vkc_runtime.bound.bind_call builds it; vkc_runtime.bound.PyBoundCall implements the same contract in
// Python, and that module's docstring argues why the re-checked facts suffice). Guarded per tensor slot: the
// exact Python type, is_cuda, get_device(), dtype (identity), shape, stride() and data_ptr() % align == 0 (the
// alignment the recorded pointer had, capped at 16); per scalar: exact type and value; the current CUDA
// context; the stream, when `stream` >= 0 (bind_call passes -1: global scratch no longer depends on the
// stream); per relation between two slots, that their byte spans do not overlap (disjoint) or that their
// pointers are equal (same), as validation found them. run() returns false, with no side effect, as soon as one fact
// differs (the op then validates again and records a new BoundCall); on a match the parameter buffers
// packed at bind time get the slots' current pointers and are launched in order.
namespace {
PyObject* s_data_ptr = nullptr;
PyObject* s_shape = nullptr;
PyObject* s_stride = nullptr;
PyObject* s_dtype = nullptr;
PyObject* s_get_device = nullptr;
PyObject* s_is_cuda = nullptr;

void intern_names() {
    if (s_data_ptr) return;
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_shape = PyUnicode_InternFromString("shape");
    s_stride = PyUnicode_InternFromString("stride");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_get_device = PyUnicode_InternFromString("get_device");
    s_is_cuda = PyUnicode_InternFromString("is_cuda");
}

// Whether `seq` (a tuple or tuple subclass such as torch.Size) holds exactly the ints `want`.
bool same_ints(PyObject* seq, const std::vector<long long>& want) {
    if (!seq || !PyTuple_Check(seq) || PyTuple_GET_SIZE(seq) != (Py_ssize_t)want.size()) return false;
    for (size_t i = 0; i < want.size(); ++i) {
        PyObject* v = PyTuple_GET_ITEM(seq, (Py_ssize_t)i);
        if (!PyLong_Check(v)) return false;
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || x != want[i]) return false;
    }
    return true;
}

// Steals `r`; true when r is an int equal to `want`.
bool steal_eq_long(PyObject* r, long long want) {
    if (!r) return false;
    bool ok = PyLong_Check(r);
    if (ok) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(r, &overflow);
        ok = !overflow && x == want;
    }
    Py_DECREF(r);
    return ok;
}
}  // namespace

class BoundCall {
    static constexpr size_t kMaxSlots = 16;

  public:
    // slots: [(type, shape, strides, dtype, device, align)]; scalars: a tuple compared by exact type and value;
    // launches: [(Launcher, gx, gy, gz, args, patches, scratch)] with args the visible values at bind time and
    // patches [(arg index, slot index)] the pointer arguments taken from a slot; ctx: the context the kernels
    // were loaded in; stream: the stream every launch must use (-1: any);
    // relations: [(kind, slot i, slot j, span i, span j)], kind 0 = byte spans [ptr, ptr + span) disjoint, 1 = same ptr.
    BoundCall(unsigned long long ctx, py::list slots, py::tuple scalars, py::list launches, long long stream,
              py::list relations)
        : ctx_(ctx), scalars_(scalars), stream_(stream) {
        intern_names();
        for (auto item : slots) {
            py::tuple t = item.cast<py::tuple>();
            if (t.size() != 6) throw py::value_error("a slot is (type, shape, strides, dtype, device, align)");
            Slot sl;
            sl.type = py::reinterpret_borrow<py::object>(t[0]);
            for (auto v : t[1].cast<py::tuple>()) sl.shape.push_back(v.cast<long long>());
            for (auto v : t[2].cast<py::tuple>()) sl.strides.push_back(v.cast<long long>());
            sl.dtype = py::reinterpret_borrow<py::object>(t[3]);
            sl.device = t[4].cast<long long>();
            sl.align = t[5].cast<unsigned long long>();
            if (sl.align == 0 || (sl.align & (sl.align - 1))) throw py::value_error("slot align must be a power of 2");
            slots_.push_back(std::move(sl));
        }
        if (slots_.size() > kMaxSlots) throw py::value_error("at most 16 tensor slots");
        for (auto item : launches) {
            py::tuple t = item.cast<py::tuple>();
            if (t.size() != 7)
                throw py::value_error("a launch is (launcher, gx, gy, gz, args, patches, scratch)");
            Bound b;
            b.owner = py::reinterpret_borrow<py::object>(t[0]);
            b.L = t[0].cast<Launcher*>();
            b.gx = t[1].cast<long long>();
            b.gy = t[2].cast<long long>();
            b.gz = t[3].cast<long long>();
            b.L->check_grid(b.gx, b.gy, b.gz);
            b.buf.assign((b.L->param_bytes() + 7) / 8 + 1, 0ull);
            b.L->pack_params(t[4].ptr(), t[6].cast<unsigned long long>(), reinterpret_cast<char*>(b.buf.data()));
            for (auto pv : t[5].cast<py::list>()) {
                py::tuple pt = pv.cast<py::tuple>();
                size_t arg = pt[0].cast<size_t>();
                int slot = pt[1].cast<int>();
                if (arg >= (size_t)b.L->n_visible() || b.L->code(arg) != 'p')
                    throw py::value_error("a patch must name a visible pointer argument");
                if (slot < 0 || (size_t)slot >= slots_.size()) throw py::value_error("a patch names no slot");
                b.patches.push_back({b.L->offset(arg), slot, b.L->divisibility(arg)});
            }
            b.empty = b.gx == 0 || b.gy == 0 || b.gz == 0;
            bound_.push_back(std::move(b));
        }
        for (auto item : relations) {
            py::tuple t = item.cast<py::tuple>();
            if (t.size() != 5) throw py::value_error("a relation is (kind, slot i, slot j, span i, span j)");
            Relation r{t[0].cast<int>(), t[1].cast<int>(), t[2].cast<int>(), t[3].cast<unsigned long long>(),
                       t[4].cast<unsigned long long>()};
            if ((r.kind != 0 && r.kind != 1) || r.i < 0 || r.j < 0 || (size_t)r.i >= slots_.size() ||
                (size_t)r.j >= slots_.size())
                throw py::value_error("bad relation");
            relations_.push_back(r);
        }
    }

    bool run(py::handle tensors_h, py::handle scalars_h, unsigned long long stream) {
        PyObject* tensors = tensors_h.ptr();
        if (!PyTuple_Check(tensors) || PyTuple_GET_SIZE(tensors) != (Py_ssize_t)slots_.size()) return false;
        if (stream_ >= 0 && stream != (unsigned long long)stream_) return false;
        if (!same_scalars(scalars_h.ptr())) return false;
        if (ctx_) {
            if (!g_drv.launch && !load_driver()) return false;  // the slow path reports it
            CUcontext cur = nullptr;
            if (!g_drv.ctx_current || g_drv.ctx_current(&cur) != 0 || (unsigned long long)(uintptr_t)cur != ctx_)
                return false;
        }
        unsigned long long ptrs[kMaxSlots];
        for (size_t i = 0; i < slots_.size(); ++i) {
            if (!read_slot(PyTuple_GET_ITEM(tensors, (Py_ssize_t)i), slots_[i], &ptrs[i])) {
                if (PyErr_Occurred()) PyErr_Clear();  // e.g. a property that raised: the slow path names it
                return false;
            }
        }
        for (auto& b : bound_) {
            for (const auto& p : b.patches)
                if (p.div > 1 && ptrs[p.slot] % (unsigned long long)p.div) return false;  // covered by align; kept
        }
        for (const auto& r : relations_) {
            unsigned long long a = ptrs[r.i], b = ptrs[r.j];
            if (r.kind == 1 ? a != b : (a < b + r.span_j && b < a + r.span_i)) return false;
        }
        ++hits_;
        alignas(16) char buf[kMaxParamBytes];
        for (auto& b : bound_) {
            if (b.empty) continue;
            size_t n = b.L->param_bytes();
            std::memcpy(buf, b.buf.data(), n);
            for (const auto& p : b.patches) std::memcpy(buf + p.offset, &ptrs[p.slot], 8);
            b.L->launch_packed(b.gx, b.gy, b.gz, stream, buf);
        }
        return true;
    }

    long long hits() const { return hits_; }
    size_t n_slots() const { return slots_.size(); }
    size_t n_launches() const { return bound_.size(); }

  private:
    struct Slot {
        py::object type, dtype;
        std::vector<long long> shape, strides;
        long long device = -1;
        unsigned long long align = 1;
    };
    struct Patch {
        uint32_t offset;
        int slot;
        int div;
    };
    struct Relation {
        int kind, i, j;
        unsigned long long span_i, span_j;
    };
    struct Bound {
        py::object owner;  // keeps the Launcher alive
        Launcher* L = nullptr;
        long long gx = 0, gy = 0, gz = 0;
        bool empty = false;
        std::vector<unsigned long long> buf;  // the packed parameters (8-byte aligned)
        std::vector<Patch> patches;
    };

    bool same_scalars(PyObject* sc) const {
        PyObject* want = scalars_.ptr();
        if (!PyTuple_Check(sc) || PyTuple_GET_SIZE(sc) != PyTuple_GET_SIZE(want)) return false;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(want); ++i) {
            PyObject* a = PyTuple_GET_ITEM(sc, i);
            PyObject* b = PyTuple_GET_ITEM(want, i);
            if (a == b) continue;
            if (Py_TYPE(a) != Py_TYPE(b)) return false;
            if (PyFloat_CheckExact(a)) {
                if (PyFloat_AS_DOUBLE(a) != PyFloat_AS_DOUBLE(b)) return false;
                continue;
            }
            int eq = PyObject_RichCompareBool(a, b, Py_EQ);
            if (eq != 1) {
                if (eq < 0) PyErr_Clear();
                return false;
            }
        }
        return true;
    }

    static bool read_slot(PyObject* obj, const Slot& s, unsigned long long* ptr) {
        if ((PyObject*)Py_TYPE(obj) != s.type.ptr()) return false;
        PyObject* r = PyObject_GetAttr(obj, s_is_cuda);
        if (!r) return false;
        bool cuda = r == Py_True;
        Py_DECREF(r);
        if (!cuda) return false;
        if (!steal_eq_long(PyObject_CallMethodNoArgs(obj, s_get_device), s.device)) return false;
        r = PyObject_GetAttr(obj, s_dtype);
        if (!r) return false;
        bool same = r == s.dtype.ptr();
        Py_DECREF(r);
        if (!same) return false;
        r = PyObject_GetAttr(obj, s_shape);
        same = same_ints(r, s.shape);
        Py_XDECREF(r);
        if (!same) return false;
        r = PyObject_CallMethodNoArgs(obj, s_stride);
        same = same_ints(r, s.strides);
        Py_XDECREF(r);
        if (!same) return false;
        r = PyObject_CallMethodNoArgs(obj, s_data_ptr);
        if (!r) return false;
        unsigned long long p = PyLong_Check(r) ? PyLong_AsUnsignedLongLong(r) : (unsigned long long)-1;
        Py_DECREF(r);
        if (p == (unsigned long long)-1) return false;  // not an int, negative or > 2^64 - 2 (PyErr cleared by run)
        if (p % s.align) return false;
        *ptr = p;
        return true;
    }

    unsigned long long ctx_;
    py::tuple scalars_;
    long long stream_;
    std::vector<Slot> slots_;
    std::vector<Bound> bound_;
    std::vector<Relation> relations_;
    long long hits_ = 0;
};

// ----------------------------------------------------------------------------------- module functions
py::bytes pack(const std::string& codes, py::handle args_h) {
    PyObject* args = args_h.ptr();
    if (!PyTuple_Check(args)) throw py::type_error("args must be a tuple");
    Layout L = make_layout(codes);
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if ((size_t)n != codes.size())
        throw py::type_error("expected " + std::to_string(codes.size()) + " values, got " + std::to_string(n));
    std::string out(L.total, '\0');
    for (size_t i = 0; i < codes.size(); ++i) {
        std::string nm = "#" + std::to_string(i);
        ArgCtx a{"pack", &nm};
        if (!pack_one(codes[i], PyTuple_GET_ITEM(args, (Py_ssize_t)i), &out[L.offsets[i]], a, 0))
            throw py::error_already_set();
    }
    return py::bytes(out);
}

py::tuple layout(const std::string& codes) {
    Layout L = make_layout(codes);
    py::list offs;
    for (auto o : L.offsets) offs.append(o);
    return py::make_tuple(offs, L.total);
}

py::dict struct_layout() {
    py::dict d;
    d["CUlaunchAttributeValue.size"] = sizeof(VkcLaunchAttributeValue);
    d["CUlaunchAttribute.size"] = sizeof(VkcLaunchAttribute);
    d["CUlaunchAttribute.value"] = offsetof(VkcLaunchAttribute, value);
    d["CUlaunchConfig.size"] = sizeof(VkcLaunchConfig);
    d["CUlaunchConfig.sharedMemBytes"] = offsetof(VkcLaunchConfig, sharedMemBytes);
    d["CUlaunchConfig.hStream"] = offsetof(VkcLaunchConfig, hStream);
    d["CUlaunchConfig.attrs"] = offsetof(VkcLaunchConfig, attrs);
    d["CUlaunchConfig.numAttrs"] = offsetof(VkcLaunchConfig, numAttrs);
    d["ATTR_COOPERATIVE"] = (int)VKC_ATTR_COOPERATIVE;
    d["ATTR_CLUSTER_DIMENSION"] = (int)VKC_ATTR_CLUSTER_DIMENSION;
    d["ATTR_CLUSTER_SCHEDULING_POLICY_PREFERENCE"] = (int)VKC_ATTR_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    d["ATTR_PROGRAMMATIC_STREAM_SERIALIZATION"] = (int)VKC_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION;
    d["CLUSTER_SCHEDULING_POLICY_SPREAD"] = (int)VKC_CLUSTER_SCHEDULING_POLICY_SPREAD;
    return d;
}

py::object driver_status() {
    if (!g_drv.tried) return py::none();
    if (g_drv.launch) return py::str("loaded " + g_drv.path);
    return py::str("failed: " + g_drv.error);
}

// ----------------------------------------------------------------------------------- DLPack producer
extern "C" {
struct VkcDLDevice { int32_t device_type; int32_t device_id; };
struct VkcDLDataType { uint8_t code; uint8_t bits; uint16_t lanes; };
struct VkcDLTensor {
    void* data;
    VkcDLDevice device;
    int32_t ndim;
    VkcDLDataType dtype;
    int64_t* shape;
    int64_t* strides;
    uint64_t byte_offset;
};
struct VkcDLManagedTensor {
    VkcDLTensor dl_tensor;
    void* manager_ctx;
    void (*deleter)(VkcDLManagedTensor* self);
};
}

struct DLHolder {
    VkcDLManagedTensor managed;
    std::vector<int64_t> shape, strides;
    PyObject* owner;
};

extern "C" void vkc_dl_deleter(VkcDLManagedTensor* self) {
    if (!self) return;
    DLHolder* h = static_cast<DLHolder*>(self->manager_ctx);
    if (h->owner && Py_IsInitialized()) {
        PyGILState_STATE st = PyGILState_Ensure();
        Py_DECREF(h->owner);
        PyGILState_Release(st);
    }
    delete h;
}

extern "C" void vkc_dl_capsule_destructor(PyObject* cap) {
    if (!PyCapsule_IsValid(cap, "dltensor")) return;  // consumed ("used_dltensor"): the consumer owns it
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    auto* m = static_cast<VkcDLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    if (m && m->deleter) m->deleter(m);
    PyErr_Restore(t, v, tb);
}

py::object make_dlpack(unsigned long long data, py::tuple shape, py::tuple strides, int code, int bits, int device_type,
                       int device_id, py::object owner) {
    if (shape.size() != strides.size()) throw py::value_error("shape and strides differ in length");
    auto* h = new DLHolder();
    for (auto s : shape) h->shape.push_back(s.cast<int64_t>());
    for (auto s : strides) h->strides.push_back(s.cast<int64_t>());
    h->owner = owner.ptr();
    Py_INCREF(h->owner);
    VkcDLTensor& t = h->managed.dl_tensor;
    t.data = reinterpret_cast<void*>((uintptr_t)data);
    t.device.device_type = device_type;
    t.device.device_id = device_id;
    t.ndim = (int32_t)h->shape.size();
    t.dtype.code = (uint8_t)code;
    t.dtype.bits = (uint8_t)bits;
    t.dtype.lanes = 1;
    t.shape = h->shape.empty() ? nullptr : h->shape.data();
    t.strides = h->strides.empty() ? nullptr : h->strides.data();
    t.byte_offset = 0;
    h->managed.manager_ctx = h;
    h->managed.deleter = vkc_dl_deleter;
    PyObject* cap = PyCapsule_New(&h->managed, "dltensor", vkc_dl_capsule_destructor);
    if (!cap) {
        vkc_dl_deleter(&h->managed);
        throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(cap);
}

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "vkc native launcher (pybind11); libcuda is dlopen'ed lazily on the first launch";
    py::class_<Launcher>(m, "Launcher")
        .def(py::init<unsigned long long, std::string, std::vector<std::string>, std::vector<int>, int, unsigned int,
                      unsigned int, unsigned int, bool, bool, std::string>(),
             py::arg("function"), py::arg("codes"), py::arg("names"), py::arg("divisibility"), py::arg("n_hidden"),
             py::arg("block_x"), py::arg("shared"), py::arg("num_ctas"), py::arg("pdl"), py::arg("cooperative"),
             py::arg("kernel_name"))
        .def("launch", &Launcher::launch, py::arg("gx"), py::arg("gy"), py::arg("gz"), py::arg("stream"),
             py::arg("args"), py::arg("scratch"))
        .def_property_readonly("name", &Launcher::name)
        .def_property_readonly("codes", &Launcher::codes)
        .def_property_readonly("n_visible", &Launcher::n_visible)
        .def_property_readonly("block_x", &Launcher::block_x)
        .def_property_readonly("shared", &Launcher::shared)
        .def_property_readonly("num_ctas", &Launcher::num_ctas)
        .def_property_readonly("uses_ex", &Launcher::uses_ex)
        .def_property_readonly("function", &Launcher::function)
        .def_property_readonly("param_bytes", &Launcher::param_bytes);
    py::class_<BoundCall>(m, "BoundCall")
        .def(py::init<unsigned long long, py::list, py::tuple, py::list, long long, py::list>(), py::arg("ctx"),
             py::arg("slots"), py::arg("scalars"), py::arg("launches"), py::arg("stream"),
             py::arg("relations") = py::list())
        .def("run", &BoundCall::run, py::arg("tensors"), py::arg("scalars"), py::arg("stream"),
             "Launch with the slots' current pointers if every guarded fact holds; False (nothing done) otherwise.")
        .def_property_readonly("hits", &BoundCall::hits)
        .def_property_readonly("n_slots", &BoundCall::n_slots)
        .def_property_readonly("n_launches", &BoundCall::n_launches);
    m.def("pack", &pack, py::arg("codes"), py::arg("args"),
          "Pack a tuple of values by pack codes exactly like launches do (bytes, padding zeroed).");
    m.def("layout", &layout, py::arg("codes"), "(offsets, total bytes) of a pack-code string.");
    m.def("struct_layout", &struct_layout, "sizeof/offsetof of the driver structs this module declares.");
    m.def("driver_status", &driver_status, "None before the first launch, else 'loaded PATH' or 'failed: WHY'.");
    m.def("_reset_driver", []() { g_drv = Driver(); }, "Forget the loaded libcuda (tests; VKC_LIBCUDA is re-read).");
    m.def("_set_exception_types", [](py::object cuda_error, py::object launch_error) {
        Py_XDECREF(g_cuda_error);
        Py_XDECREF(g_launch_error);
        g_cuda_error = cuda_error.is_none() ? nullptr : cuda_error.inc_ref().ptr();
        g_launch_error = launch_error.is_none() ? nullptr : launch_error.inc_ref().ptr();
    });
    m.def("make_dlpack", &make_dlpack, py::arg("data"), py::arg("shape"), py::arg("strides"), py::arg("code"),
          py::arg("bits"), py::arg("device_type"), py::arg("device_id"), py::arg("owner"),
          "A legacy 'dltensor' capsule viewing memory owned by `owner` (kept alive until the consumer's deleter).");
    m.attr("MAX_PARAMS") = kMaxParams;
    m.attr("MAX_PARAM_BYTES") = kMaxParamBytes;
}
