/*
 * A program that never calls nrt_close, as many framework programs do not: with
 * NEURON_RT_TRACE set, it executes MODEL ten times and returns from main. The timeline is
 * written at exit (the test reads it).
 * Usage: exit_traced MODEL (an identity model over 512 bytes)
 */
#include <string.h>

#include "nrt/nrt.h"
#include "common.h"

int main(int argc, char **argv) {
    size_t size = 0;
    void *neff;
    nrt_model_t *model = NULL;
    nrt_tensor_t *in = NULL, *out = NULL;
    nrt_tensor_set_t *inputs = NULL, *outputs = NULL;
    int i;
    ASSERT(argc == 2);
    neff = read_file(argv[1], &size);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    CHECK(nrt_load(neff, size, 0, -1, &model));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 512, "input", &in));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 512, "output", &out));
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_allocate_tensor_set(&outputs));
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "input", in));
    CHECK(nrt_add_tensor_to_tensor_set(outputs, "output", out));
    for (i = 0; i < 10; i++) {
        CHECK(nrt_execute(model, inputs, outputs));
    }
    printf("EXIT TRACED OK\n");
    return 0; /* no nrt_close */
}
