/* The ABI answers the loader checks (inference/kernel_abi.py) before calling any kernel. */
#include "chatui_kernels.h"

int chatui_abi_version(void) { return CHATUI_KERNELS_ABI; }

size_t chatui_sizeof_layer_t(void) { return sizeof(layer_t); }
