/* vkc_cute_shim: the CUDA entry points of CuTe DSL exported objects, over the driver API (see vkc_cute_shim.c). */
#ifndef VKC_CUTE_SHIM_H
#define VKC_CUTE_SHIM_H

#define VKC_CUTE_EXPORT __attribute__((visibility("default")))

/* 0 once libcuda.so.1 is open and cuInit(0) succeeded; else the CUresult (3 when the driver is missing) */
VKC_CUTE_EXPORT int vkc_cute_driver_status(void);

#endif
