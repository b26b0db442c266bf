/*
 * pthread_cancel of threads that are inside libnrt calls: three loop nrt_execute, one loops
 * nrta_execute_schedule and polls nrta_is_completed. A cancellation point inside the runtime
 * (its reads, polls and sleeps) used to start glibc's forced unwind through the library,
 * which the panic boundary cannot let pass: the process aborted ("FATAL: exception not
 * rethrown"). The cancel must act after the call returns, at the thread's own cancellation
 * point (its cleanup handler runs), and the runtime must go on working: main executes once
 * more, checks the bytes, unloads and closes.
 * Usage: cancel MODEL (an identity model over 512 bytes)
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "nrt/nrt.h"
#include "nrt/nrt_async.h"

#define THREADS 4
#define BYTES 512

static nrt_model_t *model;
static atomic_int rounds;
static atomic_int cleaned;

struct io {
    nrt_tensor_t *in, *out;
    nrt_tensor_set_t *inputs, *outputs;
};

static void io_make(struct io *io) {
    memset(io, 0, sizeof *io);
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "in", &io->in));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "out", &io->out));
    CHECK(nrt_allocate_tensor_set(&io->inputs));
    CHECK(nrt_allocate_tensor_set(&io->outputs));
    CHECK(nrt_add_tensor_to_tensor_set(io->inputs, "input", io->in));
    CHECK(nrt_add_tensor_to_tensor_set(io->outputs, "output", io->out));
}

static void cleanup(void *arg) {
    (void)arg;
    atomic_fetch_add(&cleaned, 1);
}

static void *worker(void *arg) {
    int asynchronous = arg != NULL;
    /* Static: a cancelled thread's tensors stay allocated (its requests may still run);
     * nrt_close frees them. */
    static struct io ios[THREADS];
    static atomic_int next;
    struct io *io = &ios[atomic_fetch_add(&next, 1)];
    io_make(io);
    pthread_cleanup_push(cleanup, NULL);
    for (;;) {
        if (asynchronous) {
            NRT_STATUS ret = NRT_SUCCESS;
            nrta_seq_t seq;
            bool done = false;
            CHECK(nrta_execute_schedule(model, io->inputs, io->outputs, 0, &ret, &seq));
            while (!done) {
                CHECK(nrta_is_completed(seq, &done));
            }
            ASSERT(ret == NRT_SUCCESS);
        } else {
            CHECK(nrt_execute(model, io->inputs, io->outputs));
        }
        atomic_fetch_add(&rounds, 1);
        /* The thread's own cancellation point: a cancel sent during a call acts here. */
        pthread_testcancel();
    }
    pthread_cleanup_pop(0);
    return NULL;
}

int main(int argc, char **argv) {
    pthread_t th[THREADS];
    struct io io;
    unsigned char want[BYTES], got[BYTES];
    size_t size;
    void *neff;
    int i;
    if (argc != 2) {
        return 2;
    }
    neff = read_file(argv[1], &size);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    CHECK(nrt_load(neff, size, 0, -1, &model));
    for (i = 0; i < THREADS; i++) {
        ASSERT(pthread_create(&th[i], NULL, worker, i == 0 ? (void *)1 : NULL) == 0);
    }
    while (atomic_load(&rounds) < 200) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    for (i = 0; i < THREADS; i++) {
        ASSERT(pthread_cancel(th[i]) == 0);
    }
    for (i = 0; i < THREADS; i++) {
        void *r = NULL;
        ASSERT(pthread_join(th[i], &r) == 0);
        ASSERT(r == PTHREAD_CANCELED);
    }
    ASSERT(atomic_load(&cleaned) == THREADS);
    io_make(&io);
    for (i = 0; i < BYTES; i++) {
        want[i] = (unsigned char)(i * 11 + 3);
    }
    CHECK(nrt_tensor_write(io.in, want, 0, BYTES));
    CHECK(nrt_execute(model, io.inputs, io.outputs));
    CHECK(nrt_tensor_read(io.out, got, 0, BYTES));
    ASSERT(memcmp(want, got, BYTES) == 0);
    CHECK(nrt_unload(model));
    nrt_close();
    printf("CANCEL OK\n");
    return 0;
}
