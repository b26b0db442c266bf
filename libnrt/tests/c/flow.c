/*
 * The developer-guide flow: init, load, nrt_get_model_tensor_info, one tensor per I/O name
 * (inputs on the device, outputs on the host), tensor sets, execute, read the outputs and
 * compare them with what the identity model must produce, free everything, unload, close.
 * Usage: flow MODEL
 */
#include <stdint.h>
#include <string.h>

#include "nrt/nrt.h"
#include "nrt/nrt_experimental.h"
#include "common.h"

int main(int argc, char **argv) {
    size_t model_size = 0;
    void *model_bytes;
    nrt_model_t *model = NULL;
    nrt_tensor_info_array_t *info = NULL;
    nrt_tensor_set_t *inputs = NULL, *outputs = NULL;
    nrt_tensor_t *tensors[16] = {0};
    unsigned char *expected = NULL;
    size_t expected_size = 0;
    uint64_t i;
    uint32_t vncs = 0;

    ASSERT(argc == 2);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    CHECK(nrt_get_visible_vnc_count(&vncs));
    ASSERT(vncs >= 1);

    model_bytes = read_file(argv[1], &model_size);
    CHECK(nrt_load(model_bytes, model_size, 0, -1, &model));
    free(model_bytes);

    CHECK(nrt_get_model_tensor_info(model, &info));
    ASSERT(info->tensor_count == 2 && info->tensor_count <= 16);
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_allocate_tensor_set(&outputs));
    for (i = 0; i < info->tensor_count; i++) {
        const nrt_tensor_info_t *t = &info->tensor_array[i];
        int input = t->usage == NRT_TENSOR_USAGE_INPUT;
        ASSERT(t->dtype == NRT_DTYPE_UINT8 && t->ndim == 1 && t->shape[0] == t->size);
        CHECK(nrt_tensor_allocate(input ? NRT_TENSOR_PLACEMENT_DEVICE : NRT_TENSOR_PLACEMENT_HOST,
                                  input ? 0 : -1, t->size, t->name, &tensors[i]));
        if (input) {
            size_t j;
            expected = malloc(t->size);
            expected_size = t->size;
            for (j = 0; j < t->size; j++) {
                expected[j] = (unsigned char)(j * 7 + 3);
            }
            CHECK(nrt_tensor_write(tensors[i], expected, 0, t->size));
            CHECK(nrt_add_tensor_to_tensor_set(inputs, t->name, tensors[i]));
        } else {
            CHECK(nrt_add_tensor_to_tensor_set(outputs, t->name, tensors[i]));
        }
    }
    ASSERT(expected != NULL);

    CHECK(nrt_execute(model, inputs, outputs));

    for (i = 0; i < info->tensor_count; i++) {
        const nrt_tensor_info_t *t = &info->tensor_array[i];
        if (t->usage == NRT_TENSOR_USAGE_OUTPUT) {
            unsigned char *out = malloc(t->size);
            nrt_tensor_t *looked_up = NULL;
            ASSERT(t->size == expected_size);
            CHECK(nrt_get_tensor_from_tensor_set(outputs, t->name, &looked_up));
            ASSERT(looked_up == tensors[i]);
            CHECK(nrt_tensor_read(looked_up, out, 0, t->size));
            ASSERT(memcmp(out, expected, t->size) == 0);
            free(out);
        }
    }

    for (i = 0; i < info->tensor_count; i++) {
        nrt_tensor_free(&tensors[i]);
        ASSERT(tensors[i] == NULL);
    }
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    ASSERT(inputs == NULL && outputs == NULL);
    CHECK(nrt_free_model_tensor_info(info));
    CHECK(nrt_unload(model));
    nrt_close();
    free(expected);
    printf("FLOW OK\n");
    return 0;
}
