/*
 * The digits MLP through the C API: 360 held-out UCI digits, one image per execution, float32
 * in, ten logits out; prints the accuracy. Usage: digits MODEL INPUTS LABELS
 * (INPUTS: 360 x 64 float32, LABELS: 360 int32, both little-endian raw arrays)
 */
#include <stdint.h>
#include <string.h>

#include "nrt/nrt.h"
#include "nrt/nrt_experimental.h"
#include "common.h"

#define FEATURES 64
#define CLASSES 10

int main(int argc, char **argv) {
    size_t model_size = 0, inputs_size = 0, labels_size = 0;
    void *model_bytes;
    float *images;
    int32_t *labels;
    size_t count, i;
    int correct = 0, k;
    nrt_model_t *model = NULL;
    nrt_tensor_info_array_t *info = NULL;
    nrt_tensor_t *in = NULL, *out = NULL;
    nrt_tensor_set_t *inputs = NULL, *outputs = NULL;
    const char *in_name = NULL, *out_name = NULL;
    float logits[CLASSES];
    uint64_t t;

    ASSERT(argc == 4);
    model_bytes = read_file(argv[1], &model_size);
    images = read_file(argv[2], &inputs_size);
    labels = read_file(argv[3], &labels_size);
    count = labels_size / sizeof(int32_t);
    ASSERT(inputs_size == count * FEATURES * sizeof(float));

    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    CHECK(nrt_load(model_bytes, model_size, -1, -1, &model));
    CHECK(nrt_get_model_tensor_info(model, &info));
    for (t = 0; t < info->tensor_count; t++) {
        const nrt_tensor_info_t *ti = &info->tensor_array[t];
        ASSERT(ti->dtype == NRT_DTYPE_FLOAT32);
        if (ti->usage == NRT_TENSOR_USAGE_INPUT) {
            ASSERT(ti->size == FEATURES * sizeof(float));
            in_name = ti->name;
        } else {
            ASSERT(ti->size == CLASSES * sizeof(float));
            out_name = ti->name;
        }
    }
    ASSERT(in_name && out_name);
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, FEATURES * sizeof(float), "image", &in));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, CLASSES * sizeof(float), "logits", &out));
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_allocate_tensor_set(&outputs));
    CHECK(nrt_add_tensor_to_tensor_set(inputs, in_name, in));
    CHECK(nrt_add_tensor_to_tensor_set(outputs, out_name, out));

    for (i = 0; i < count; i++) {
        int best = 0;
        CHECK(nrt_tensor_write(in, &images[i * FEATURES], 0, FEATURES * sizeof(float)));
        CHECK(nrt_execute(model, inputs, outputs));
        CHECK(nrt_tensor_read(out, logits, 0, sizeof logits));
        for (k = 1; k < CLASSES; k++) {
            if (logits[k] > logits[best]) {
                best = k;
            }
        }
        correct += best == labels[i];
    }
    printf("images %zu correct %d accuracy %.6f\n", count, correct, (double)correct / (double)count);

    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    nrt_tensor_free(&in);
    nrt_tensor_free(&out);
    CHECK(nrt_free_model_tensor_info(info));
    CHECK(nrt_unload(model));
    nrt_close();
    free(model_bytes);
    free(images);
    free(labels);
    return 0;
}
