/*
 * 8 threads calling nrt_execute on one identity model, each with its own tensors; every
 * output is checked against the input that thread wrote. Usage: threads MODEL
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "nrt/nrt.h"
#include "common.h"

#define THREADS 8
#define ITERATIONS 50
#define BYTES 512

static nrt_model_t *model;
static int failures[THREADS];

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    nrt_tensor_t *in = NULL, *out = NULL;
    nrt_tensor_set_t *inputs = NULL, *outputs = NULL;
    unsigned char want[BYTES], got[BYTES];
    int i, j;

    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "in", &in));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "out", &out));
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_allocate_tensor_set(&outputs));
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "input", in));
    CHECK(nrt_add_tensor_to_tensor_set(outputs, "output", out));
    for (i = 0; i < ITERATIONS; i++) {
        for (j = 0; j < BYTES; j++) {
            want[j] = (unsigned char)(id * 31 + i * 7 + j);
        }
        CHECK(nrt_tensor_write(in, want, 0, BYTES));
        CHECK(nrt_execute(model, inputs, outputs));
        CHECK(nrt_tensor_read(out, got, 0, BYTES));
        if (memcmp(want, got, BYTES) != 0) {
            failures[id]++;
        }
    }
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    nrt_tensor_free(&in);
    nrt_tensor_free(&out);
    return NULL;
}

int main(int argc, char **argv) {
    size_t size = 0;
    void *bytes;
    pthread_t threads[THREADS];
    int i, total = 0;

    ASSERT(argc == 2);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    bytes = read_file(argv[1], &size);
    CHECK(nrt_load(bytes, size, 0, -1, &model));
    free(bytes);
    for (i = 0; i < THREADS; i++) {
        ASSERT(pthread_create(&threads[i], NULL, worker, (void *)(intptr_t)i) == 0);
    }
    for (i = 0; i < THREADS; i++) {
        ASSERT(pthread_join(threads[i], NULL) == 0);
        total += failures[i];
    }
    CHECK(nrt_unload(model));
    nrt_close();
    if (total != 0) {
        fprintf(stderr, "%d of %d outputs were wrong\n", total, THREADS * ITERATIONS);
        return 1;
    }
    printf("THREADS OK %d\n", THREADS * ITERATIONS);
    return 0;
}
