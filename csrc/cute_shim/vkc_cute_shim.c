/* vkc_cute_shim: the eight CUDA entry points that an object exported by the CuTe DSL (`export_to_c`) leaves
 * undefined, implemented over the CUDA driver API.
 *
 * The exported host code calls `_cudaLibraryLoadData`, `_cudaLibraryGetKernel`, `_cudaGetDevice`,
 * `_cudaDeviceGetAttribute`, `_cudaFuncSetAttribute`, `_cudaKernelSetAttributeForDevice`, `_cudaLaunchKernelEx`
 * (runtime-API signatures) and `_cuKernelGetAttribute` (driver signature, device given as an ordinal). The DSL
 * ships them in a static runtime library over cudart; this file replaces both, so an artifact holds no NVIDIA
 * runtime code and needs no CUDA library at link time: libcuda.so.1 is opened with dlopen on first use.
 *
 * Handle and enum compatibility relied on (CUDA 12 and 13 headers): cudaLibrary_t == CUlibrary,
 * cudaKernel_t == CUkernel, cudaStream_t == CUstream; cudaDeviceAttr numbers == CUdevice_attribute numbers;
 * cudaLaunchAttribute and CUlaunchAttribute share id numbers and layout; cudaFuncAttribute 8..15 == the
 * CUfunction_attribute of the same number. Error codes returned are CUresult values (0 = success); 3
 * (CUDA_ERROR_NOT_INITIALIZED) also means "libcuda.so.1 could not be opened or cuInit failed".
 *
 * No CUDA header is included: the few driver types are declared below, so the shim cross-compiles for any
 * host without a CUDA toolkit.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "vkc_cute_shim.h"

/* glibc 2.34 moved dlopen/dlsym/pthread_once into libc under a new symbol version; binding to the original
 * versions (libc keeps them as compatibility symbols) keeps the artifact loadable on older hosts, where those
 * functions live in libdl.so.2 / libpthread.so.0 (which tools/cute/build.py adds as NEEDED). */
#if defined(__x86_64__)
#define VKC_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define VKC_GLIBC_BASE "GLIBC_2.17"
#endif
#ifdef VKC_GLIBC_BASE
__asm__(".symver dlopen,dlopen@" VKC_GLIBC_BASE);
__asm__(".symver dlsym,dlsym@" VKC_GLIBC_BASE);
__asm__(".symver pthread_once,pthread_once@" VKC_GLIBC_BASE);
#endif

/* ---- the driver types used here (ABI-stable since CUDA 12.0) ---------------------------------------------- */
typedef int CUresult;
typedef int CUdevice;
typedef void *CUlibrary;
typedef void *CUkernel;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUcontext;

enum {
    VKC_CUDA_SUCCESS = 0,
    VKC_CUDA_ERROR_INVALID_VALUE = 1,
    VKC_CUDA_ERROR_NOT_INITIALIZED = 3,
    VKC_CUDA_ERROR_NOT_SUPPORTED = 801,
};

typedef struct {
    int id;
    char pad[4];
    unsigned char value[64];
} vkc_launch_attr; /* CUlaunchAttribute / cudaLaunchAttribute */

typedef struct {
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, smem_bytes;
    CUstream stream;
    vkc_launch_attr *attrs;
    unsigned num_attrs;
} vkc_cu_launch_config; /* CUlaunchConfig */

typedef struct {
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z;
    size_t smem_bytes;
    CUstream stream;
    vkc_launch_attr *attrs;
    unsigned num_attrs;
} vkc_rt_launch_config; /* cudaLaunchConfig_t */

_Static_assert(sizeof(vkc_launch_attr) == 72, "launch attribute layout");
_Static_assert(offsetof(vkc_cu_launch_config, stream) == 32, "CUlaunchConfig layout");
_Static_assert(offsetof(vkc_rt_launch_config, stream) == 32, "cudaLaunchConfig_t layout");

#define VKC_MAX_LAUNCH_ATTRS 32

/* ---- the driver entry points, resolved once ------------------------------------------------------------- */
static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_get_attribute)(int *, int, CUdevice);
    CUresult (*ctx_get_device)(CUdevice *);
    CUresult (*library_load_data)(CUlibrary *, const void *, void *, void **, unsigned, void *, void **, unsigned);
    CUresult (*library_get_kernel)(CUkernel *, CUlibrary, const char *);
    CUresult (*kernel_get_attribute)(int *, int, CUkernel, CUdevice);
    CUresult (*kernel_set_attribute)(int, int, CUkernel, CUdevice);
    CUresult (*launch_kernel_ex)(const vkc_cu_launch_config *, CUfunction, void **, void **);
} drv;

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static CUresult drv_status = VKC_CUDA_ERROR_NOT_INITIALIZED;

static void *sym(void *h, const char *name, int *missing) {
    void *p = dlsym(h, name);
    if (!p) *missing = 1;
    return p;
}

static void drv_open(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return; /* no driver: every entry point reports NOT_INITIALIZED */
    int missing = 0;
    /* the *_v2 / versioned names are the ones the CUDA 12+ headers map the plain names to */
    drv.init = (CUresult(*)(unsigned))sym(h, "cuInit", &missing);
    drv.device_get = (CUresult(*)(CUdevice *, int))sym(h, "cuDeviceGet", &missing);
    drv.device_get_attribute = (CUresult(*)(int *, int, CUdevice))sym(h, "cuDeviceGetAttribute", &missing);
    drv.ctx_get_device = (CUresult(*)(CUdevice *))sym(h, "cuCtxGetDevice", &missing);
    drv.library_load_data = (CUresult(*)(CUlibrary *, const void *, void *, void **, unsigned, void *, void **,
                                         unsigned))sym(h, "cuLibraryLoadData", &missing);
    drv.library_get_kernel = (CUresult(*)(CUkernel *, CUlibrary, const char *))sym(h, "cuLibraryGetKernel", &missing);
    drv.kernel_get_attribute = (CUresult(*)(int *, int, CUkernel, CUdevice))sym(h, "cuKernelGetAttribute", &missing);
    drv.kernel_set_attribute = (CUresult(*)(int, int, CUkernel, CUdevice))sym(h, "cuKernelSetAttribute", &missing);
    drv.launch_kernel_ex = (CUresult(*)(const vkc_cu_launch_config *, CUfunction, void **, void **))sym(
        h, "cuLaunchKernelEx", &missing);
    if (missing) return; /* a driver older than CUDA 12.0 */
    drv_status = drv.init(0);
}

static CUresult ready(void) {
    pthread_once(&drv_once, drv_open);
    return drv_status;
}

#define REQUIRE_DRIVER()                  \
    do {                                  \
        CUresult st_ = ready();           \
        if (st_ != VKC_CUDA_SUCCESS) return st_; \
    } while (0)

/* cudaFuncAttribute values the exported code may set, all numbered like their CUfunction_attribute twins */
static int func_attribute_known(int attr) { return attr >= 8 && attr <= 15; }

/* ---- the entry points ---------------------------------------------------------------------------------- */
int vkc_cute_driver_status(void) { return ready(); }

int _cudaLibraryLoadData(CUlibrary *library, const void *code, void *jit_options, void **jit_values,
                         unsigned num_jit, void *lib_options, void **lib_values, unsigned num_lib) {
    REQUIRE_DRIVER();
    /* the exported objects pass no options; the runtime's option enums are not mapped here */
    if (num_jit || num_lib) return VKC_CUDA_ERROR_NOT_SUPPORTED;
    (void)jit_options, (void)jit_values, (void)lib_options, (void)lib_values;
    return drv.library_load_data(library, code, NULL, NULL, 0, NULL, NULL, 0);
}

int _cudaLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name) {
    REQUIRE_DRIVER();
    return drv.library_get_kernel(kernel, library, name);
}

int _cudaGetDevice(int *device) {
    REQUIRE_DRIVER();
    CUdevice d;
    CUresult st = drv.ctx_get_device(&d); /* no current context is an error here, unlike cudart */
    if (st == VKC_CUDA_SUCCESS) *device = (int)d;
    return st;
}

int _cudaDeviceGetAttribute(int *value, int attr, int device) {
    REQUIRE_DRIVER();
    CUdevice d;
    CUresult st = drv.device_get(&d, device);
    return st != VKC_CUDA_SUCCESS ? st : drv.device_get_attribute(value, attr, d);
}

int _cuKernelGetAttribute(int *value, int attr, CUkernel kernel, int device) {
    REQUIRE_DRIVER();
    CUdevice d;
    CUresult st = drv.device_get(&d, device);
    return st != VKC_CUDA_SUCCESS ? st : drv.kernel_get_attribute(value, attr, kernel, d);
}

int _cudaKernelSetAttributeForDevice(CUkernel kernel, int attr, int value, int device) {
    REQUIRE_DRIVER();
    if (!func_attribute_known(attr)) return VKC_CUDA_ERROR_NOT_SUPPORTED;
    CUdevice d;
    CUresult st = drv.device_get(&d, device);
    return st != VKC_CUDA_SUCCESS ? st : drv.kernel_set_attribute(attr, value, kernel, d);
}

/* `func` is the cudaKernel_t from _cudaLibraryGetKernel; the runtime applies it to the current device */
int _cudaFuncSetAttribute(const void *func, int attr, int value) {
    REQUIRE_DRIVER();
    if (!func_attribute_known(attr)) return VKC_CUDA_ERROR_NOT_SUPPORTED;
    CUdevice d;
    CUresult st = drv.ctx_get_device(&d);
    return st != VKC_CUDA_SUCCESS ? st : drv.kernel_set_attribute(attr, value, (CUkernel)func, d);
}

int _cudaLaunchKernelEx(const vkc_rt_launch_config *config, const void *func, void **args) {
    REQUIRE_DRIVER();
    if (!config || !func) return VKC_CUDA_ERROR_INVALID_VALUE;
    if (config->smem_bytes > 0xffffffffu || config->num_attrs > VKC_MAX_LAUNCH_ATTRS) return VKC_CUDA_ERROR_INVALID_VALUE;
    vkc_launch_attr attrs[VKC_MAX_LAUNCH_ATTRS];
    if (config->num_attrs) memcpy(attrs, config->attrs, config->num_attrs * sizeof(vkc_launch_attr));
    vkc_cu_launch_config cfg = {
        config->grid_x, config->grid_y, config->grid_z, config->block_x, config->block_y, config->block_z,
        (unsigned)config->smem_bytes, config->stream, config->num_attrs ? attrs : NULL, config->num_attrs,
    };
    /* cuLaunchKernelEx takes a CUkernel in place of a CUfunction (CUDA 12.0+): it is loaded into the current
     * context on first use */
    return drv.launch_kernel_ex(&cfg, (CUfunction)func, args, NULL);
}
