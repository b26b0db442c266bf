/*
 * nrt_unload while other threads execute the model: every call gets NRT_SUCCESS (it ran before
 * the unload took the model) or NRT_INVALID naming the pointer (after) — never the runtime's
 * NRT_INVALID_HANDLE from inside the unload, which waits for the executions in flight.
 * Usage: unload_race MODEL (the 512-byte identity model: "input" -> "output")
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "nrt/nrt.h"
#include "common.h"

#define BYTES 512
#define THREADS 2

static nrt_model_t *model;
static atomic_int unloaded;

struct worker {
    pthread_t thread;
    nrt_tensor_set_t *inputs, *outputs;
    long ran, refused, after;
    NRT_STATUS other;
};

static void *execute_until_refused(void *arg) {
    struct worker *w = arg;
    /* Executes until the unload has returned and 100 calls after it were refused. */
    for (;;) {
        NRT_STATUS s = nrt_execute(model, w->inputs, w->outputs);
        if (s == NRT_SUCCESS) {
            w->ran++;
        } else if (s == NRT_INVALID) {
            w->refused++;
            if (atomic_load(&unloaded) && ++w->after >= 100) {
                return NULL;
            }
        } else {
            w->other = s;
            return NULL;
        }
    }
}

int main(int argc, char **argv) {
    size_t size;
    void *bytes;
    struct worker w[THREADS];
    int i;
    ASSERT(argc == 2);
    bytes = read_file(argv[1], &size);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    CHECK(nrt_load(bytes, size, 0, -1, &model));
    for (i = 0; i < THREADS; i++) {
        nrt_tensor_t *in = NULL, *out = NULL;
        w[i].ran = w[i].refused = w[i].after = 0;
        w[i].other = NRT_SUCCESS;
        CHECK(nrt_allocate_tensor_set(&w[i].inputs));
        CHECK(nrt_allocate_tensor_set(&w[i].outputs));
        CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "in", &in));
        CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "out", &out));
        CHECK(nrt_add_tensor_to_tensor_set(w[i].inputs, "input", in));
        CHECK(nrt_add_tensor_to_tensor_set(w[i].outputs, "output", out));
    }
    for (i = 0; i < THREADS; i++) {
        ASSERT(pthread_create(&w[i].thread, NULL, execute_until_refused, &w[i]) == 0);
    }
    /* Both threads are executing. */
    for (;;) {
        long ran = 0;
        for (i = 0; i < THREADS; i++) {
            ran += w[i].ran < 50 ? 0 : 1;
        }
        if (ran == THREADS) {
            break;
        }
        sched_yield();
    }
    CHECK(nrt_unload(model));
    atomic_store(&unloaded, 1);
    EXPECT(nrt_unload(model), NRT_INVALID);
    for (i = 0; i < THREADS; i++) {
        ASSERT(pthread_join(w[i].thread, NULL) == 0);
        if (w[i].other != NRT_SUCCESS) {
            fprintf(stderr, "thread %d: nrt_execute returned %d (%s) around the unload\n", i,
                    (int)w[i].other, nrt_get_status_as_str(w[i].other));
            return 1;
        }
        printf("thread %d: ran %ld, refused %ld, after the unload %ld\n", i, w[i].ran,
               w[i].refused, w[i].after);
        ASSERT(w[i].refused >= 100);
    }
    nrt_close();
    free(bytes);
    printf("UNLOAD RACE OK\n");
    return 0;
}
