// Every public header in one C++17 translation unit (warnings as errors, pedantic), the ABI
// facts checked at compile time, and a few calls linked against libnrt.so.1.
#include <cstddef>
#include <cstring>
#include <cstdio>

#include "nrt/ndebug_stream.h"
#include "nrt/nrt.h"
#include "nrt/nrt_async.h"
#include "nrt/nrt_experimental.h"
#include "nrt/nrt_profile.h"
#include "nrt/nrt_status.h"
#include "nrt/nrt_sys_trace.h"
#include "nrt/nrt_version.h"

static_assert(sizeof(nrt_version_t) == 224, "nrt_version_t");
static_assert(sizeof(nrt_tensor_info_t) == 296, "nrt_tensor_info_t");
static_assert(offsetof(nrt_tensor_info_t, shape) == 280, "nrt_tensor_info_t::shape");
static_assert(sizeof(nrt_instance_info_t) == 32, "nrt_instance_info_t");
static_assert(NRTA_XU_COMPUTE == 1 && NRTA_XU_TYPE_NUM == 3, "nrta_xu_t");
static_assert(NRT_DTYPE_FLOAT32 == 0xA, "nrt_dtype_t");

int main() {
    nrt_version_t v;
    std::memset(&v, 0, sizeof v);
    if (nrt_get_version(&v, sizeof v) != NRT_SUCCESS || v.rt_major != NRT_MAJOR_VERSION) {
        return 1;
    }
    if (std::strcmp(nrt_get_status_as_str(NRT_QUEUE_FULL), "NRT_QUEUE_FULL") != 0) {
        return 1;
    }
    nrt_tensor_t *t = nullptr;
    if (nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 8, "t", &t) != NRT_UNINITIALIZED) {
        return 1;
    }
    std::printf("CXX OK %s\n", v.rt_detail);
    return 0;
}
