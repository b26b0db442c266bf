/*
 * A real NEFF through the C API: nrt_load recognises it by its header and places it (trn2,
 * NEURON_LOGICAL_NC_CONFIG=2), nrt_get_model_tensor_info reports its float16 inputs and output
 * with their shapes, nrt_unload gives back every byte of the core's memory statistics.
 * Usage: neff_info matmul_small.neff
 */
#include <stdint.h>
#include <string.h>

#include "nrt/nrt.h"
#include "nrt/nrt_experimental.h"
#include "common.h"

static void expect_tensor(const nrt_tensor_info_t *t, const char *name, nrt_tensor_usage_t usage,
                          size_t size, uint32_t d0, uint32_t d1) {
    printf("%s usage=%d dtype=%d size=%zu shape=[%u,%u]\n", t->name, (int)t->usage,
           (int)t->dtype, t->size, t->ndim > 0 ? t->shape[0] : 0, t->ndim > 1 ? t->shape[1] : 0);
    ASSERT(strcmp(t->name, name) == 0);
    ASSERT(t->usage == usage);
    ASSERT(t->dtype == NRT_DTYPE_FLOAT16 && (int)t->dtype == 7);
    ASSERT(t->size == size);
    ASSERT(t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1);
}

int main(int argc, char **argv) {
    size_t size = 0, n = 0;
    void *bytes;
    nrt_model_t *model = NULL;
    nrt_tensor_info_array_t *info = NULL;
    nrt_vnc_memory_stats_t before, after;

    ASSERT(argc == 2);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    bytes = read_file(argv[1], &size);
    CHECK(nrt_get_vnc_memory_stats(0, &before, sizeof before, &n));
    CHECK(nrt_load(bytes, size, 0, -1, &model));
    CHECK(nrt_get_model_tensor_info(model, &info));
    ASSERT(info->tensor_count == 3);
    expect_tensor(&info->tensor_array[0], "x", NRT_TENSOR_USAGE_INPUT, 65536, 128, 256);
    expect_tensor(&info->tensor_array[1], "y", NRT_TENSOR_USAGE_INPUT, 65536, 256, 128);
    expect_tensor(&info->tensor_array[2], "output0", NRT_TENSOR_USAGE_OUTPUT, 32768, 128, 128);
    CHECK(nrt_free_model_tensor_info(info));
    CHECK(nrt_unload(model));
    CHECK(nrt_get_vnc_memory_stats(0, &after, sizeof after, &n));
    ASSERT(after.bytes_used == before.bytes_used);
    free(bytes);
    nrt_close();
    printf("NEFF INFO OK\n");
    return 0;
}
