/*
 * Batched tensor reads and writes, and output completion counts, from C:
 * - nrt_tensor_write_batch / nrt_tensor_read_batch over two tensors, called with the 2.34.10
 *   signature and, through dlsym, with the earlier one's third argument (`bool unsafe`);
 *   a batch with one wrong operation (out of range, NULL buffer) copies nothing;
 * - nrt_tensor_check_output_completion: a poll before any execution, counts after sync
 *   executions (a device output, a host output, a slice with its own count, an input that is
 *   never counted), a reset, a wait with a timeout that runs out, an unbounded wait for
 *   executions scheduled with nrta_execute_schedule (woken by the runtime's worker), NULL and
 *   a freed handle; a wait ends when its tensor is freed (NRT_INVALID) or nrt_close is called
 *   (NRT_CLOSED).
 * Usage: outputs MODEL (the 512-byte identity model: "input" -> "output")
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nrt/nrt.h"
#include "nrt/nrt_async.h"
#include "common.h"

#define BYTES 512
#define ASYNC 4

static void fill(unsigned char *p, size_t n, unsigned seed) {
    size_t i;
    for (i = 0; i < n; i++) {
        p[i] = (unsigned char)(i * 7 + seed);
    }
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A wait for one completion of `tensor`, on a thread of its own, that nothing will complete
 * (30 s: the same path as an unbounded wait, which a regression would hang on). */
struct waiter {
    pthread_t thread;
    nrt_tensor_t *tensor;
    NRT_STATUS status;
};

static void *wait_unbounded(void *arg) {
    struct waiter *w = arg;
    w->status = nrt_tensor_check_output_completion(w->tensor, 30 * 1000 * 1000, 1);
    return NULL;
}

static void start_waiter(struct waiter *w, nrt_tensor_t *tensor) {
    w->tensor = tensor;
    w->status = (NRT_STATUS)0xDEAD;
    ASSERT(pthread_create(&w->thread, NULL, wait_unbounded, w) == 0);
    usleep(50 * 1000); /* it is waiting (or about to: either way the end below wakes it) */
}

static void batches(void) {
    nrt_tensor_t *a = NULL, *b = NULL;
    unsigned char lo[256], hi[256], small[64], back_a[BYTES], back_b[64], zeros[BYTES];
    nrt_tensor_batch_op_t a_ops[2], b_ops[1], bad_ops[2], read_a[1], read_b[1];
    nrt_tensor_batch_t w[2], r[2], bad[2];

    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "a", &a));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 64, "b", &b));
    fill(lo, sizeof lo, 1);
    fill(hi, sizeof hi, 2);
    fill(small, sizeof small, 3);
    memset(zeros, 0, sizeof zeros);

    /* Two operations on `a` (its two halves) and one on `b`, written in one call. */
    a_ops[0] = (nrt_tensor_batch_op_t){.offset = 0, .size = 256, .buffer = lo};
    a_ops[1] = (nrt_tensor_batch_op_t){.offset = 256, .size = 256, .buffer = hi};
    b_ops[0] = (nrt_tensor_batch_op_t){.offset = 0, .size = 64, .buffer = small};
    w[0] = (nrt_tensor_batch_t){.tensor = a, .ops = a_ops, .num_ops = 2};
    w[1] = (nrt_tensor_batch_t){.tensor = b, .ops = b_ops, .num_ops = 1};
    CHECK(nrt_tensor_write_batch(w, 2));

    /* Read back as a caller built against the earlier signature does, with a third argument
     * (`unsafe`): through a pointer of that type, as dlsym hands it out. */
    read_a[0] = (nrt_tensor_batch_op_t){.offset = 0, .size = BYTES, .buffer = back_a};
    read_b[0] = (nrt_tensor_batch_op_t){.offset = 0, .size = 64, .buffer = back_b};
    r[0] = (nrt_tensor_batch_t){.tensor = a, .ops = read_a, .num_ops = 1};
    r[1] = (nrt_tensor_batch_t){.tensor = b, .ops = read_b, .num_ops = 1};
    {
        typedef NRT_STATUS (*read_batch_3)(const nrt_tensor_batch_t *, uint64_t, bool);
        read_batch_3 old_read;
        void *sym = dlsym(RTLD_DEFAULT, "nrt_tensor_read_batch");
        ASSERT(sym != NULL);
        memcpy(&old_read, &sym, sizeof old_read);
        CHECK(old_read(r, 2, true));
    }
    ASSERT(memcmp(back_a, lo, 256) == 0 && memcmp(back_a + 256, hi, 256) == 0);
    ASSERT(memcmp(back_b, small, 64) == 0);
    CHECK(nrt_tensor_read_batch(r, 0));
    CHECK(nrt_tensor_write_batch(NULL, 0));

    /* A wrong second operation: nothing of the batch is written, not even its first one. */
    CHECK(nrt_tensor_write(a, zeros, 0, BYTES));
    bad_ops[0] = (nrt_tensor_batch_op_t){.offset = 0, .size = 256, .buffer = lo};
    bad_ops[1] = (nrt_tensor_batch_op_t){.offset = 300, .size = 256, .buffer = hi};
    bad[0] = (nrt_tensor_batch_t){.tensor = a, .ops = bad_ops, .num_ops = 2};
    EXPECT(nrt_tensor_write_batch(bad, 1), NRT_INVALID);
    bad_ops[1] = (nrt_tensor_batch_op_t){.offset = 256, .size = 16, .buffer = NULL};
    EXPECT(nrt_tensor_write_batch(bad, 1), NRT_INVALID);
    /* ... and a wrong second batch stops the first one too. */
    bad[0] = (nrt_tensor_batch_t){.tensor = a, .ops = a_ops, .num_ops = 2};
    bad[1] = (nrt_tensor_batch_t){.tensor = NULL, .ops = b_ops, .num_ops = 1};
    EXPECT(nrt_tensor_write_batch(bad, 2), NRT_INVALID);
    CHECK(nrt_tensor_read(a, back_a, 0, BYTES));
    ASSERT(memcmp(back_a, zeros, BYTES) == 0);
    EXPECT(nrt_tensor_read_batch(NULL, 1), NRT_INVALID);
    bad[0] = (nrt_tensor_batch_t){.tensor = a, .ops = NULL, .num_ops = 1};
    EXPECT(nrt_tensor_read_batch(bad, 1), NRT_INVALID);

    nrt_tensor_free(&a);
    nrt_tensor_free(&b);
}

static void completions(nrt_model_t *model) {
    nrt_tensor_t *in = NULL, *out = NULL, *host_out = NULL, *big = NULL, *slice = NULL;
    nrt_tensor_t *outs[ASYNC] = {NULL}, *freed = NULL;
    nrt_tensor_set_t *inputs = NULL, *outputs = NULL, *host_outputs = NULL, *slice_outputs = NULL;
    nrt_tensor_set_t *async_outputs[ASYNC] = {NULL};
    NRT_STATUS rets[ASYNC];
    nrta_seq_t seqs[ASYNC];
    unsigned char data[BYTES], got[BYTES];
    double t;
    int i;

    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "in", &in));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "out", &out));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, BYTES, "host_out", &host_out));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 2 * BYTES, "big", &big));
    CHECK(nrt_tensor_allocate_slice(big, BYTES, BYTES, "slice", &slice));
    fill(data, sizeof data, 9);
    CHECK(nrt_tensor_write(in, data, 0, BYTES));
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "input", in));
    CHECK(nrt_allocate_tensor_set(&outputs));
    CHECK(nrt_add_tensor_to_tensor_set(outputs, "output", out));
    CHECK(nrt_allocate_tensor_set(&host_outputs));
    CHECK(nrt_add_tensor_to_tensor_set(host_outputs, "output", host_out));
    CHECK(nrt_allocate_tensor_set(&slice_outputs));
    CHECK(nrt_add_tensor_to_tensor_set(slice_outputs, "output", slice));

    /* Nothing written yet: a poll for one is NRT_TIMEOUT, for none NRT_SUCCESS. */
    EXPECT(nrt_tensor_check_output_completion(out, 0, 1), NRT_TIMEOUT);
    CHECK(nrt_tensor_check_output_completion(out, 0, 0));

    /* Three sync executions count three on the device output. */
    for (i = 0; i < 3; i++) {
        CHECK(nrt_execute(model, inputs, outputs));
    }
    CHECK(nrt_tensor_check_output_completion(out, 0, 3));
    EXPECT(nrt_tensor_check_output_completion(out, 0, 4), NRT_TIMEOUT);
    /* A timeout that runs out waits about as long as it says. */
    t = now_s();
    EXPECT(nrt_tensor_check_output_completion(out, 50000, 4), NRT_TIMEOUT);
    ASSERT(now_s() - t >= 0.045);
    /* The input is never an output; the others' counts are their own. */
    EXPECT(nrt_tensor_check_output_completion(in, 0, 1), NRT_TIMEOUT);
    EXPECT(nrt_tensor_check_output_completion(host_out, 0, 1), NRT_TIMEOUT);

    /* A host output counts once its bytes are copied back. */
    CHECK(nrt_execute(model, inputs, host_outputs));
    CHECK(nrt_tensor_check_output_completion(host_out, 0, 1));
    CHECK(nrt_tensor_read(host_out, got, 0, BYTES));
    ASSERT(memcmp(got, data, BYTES) == 0);

    /* A slice has its own count; the tensor it aliases has none from it. */
    CHECK(nrt_execute(model, inputs, slice_outputs));
    CHECK(nrt_execute(model, inputs, slice_outputs));
    CHECK(nrt_tensor_check_output_completion(slice, 0, 2));
    EXPECT(nrt_tensor_check_output_completion(big, 0, 1), NRT_TIMEOUT);

    /* A reset starts again from 0. */
    CHECK(nrt_tensor_reset_output_completion(out));
    EXPECT(nrt_tensor_check_output_completion(out, 0, 1), NRT_TIMEOUT);

    /*
     * Streaming: executions scheduled asynchronously, each into its own output, and an
     * unbounded wait on each output in turn (woken by the runtime's worker thread); the bytes
     * are there once it returns.
     */
    for (i = 0; i < ASYNC; i++) {
        CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "async_out", &outs[i]));
        CHECK(nrt_allocate_tensor_set(&async_outputs[i]));
        CHECK(nrt_add_tensor_to_tensor_set(async_outputs[i], "output", outs[i]));
    }
    for (i = 0; i < ASYNC; i++) {
        CHECK(nrta_execute_schedule(model, inputs, async_outputs[i], 0, &rets[i], &seqs[i]));
    }
    for (i = 0; i < ASYNC; i++) {
        CHECK(nrt_tensor_check_output_completion(outs[i], -1, 1));
        CHECK(nrt_tensor_read(outs[i], got, 0, BYTES));
        ASSERT(memcmp(got, data, BYTES) == 0);
    }
    for (i = 0; i < ASYNC; i++) {
        bool done = false;
        while (!done) {
            CHECK(nrta_is_completed(seqs[i], &done));
        }
        ASSERT(rets[i] == NRT_SUCCESS);
    }
    /* The same output scheduled twice more: a wait for three counts all of them. */
    CHECK(nrta_execute_schedule(model, inputs, async_outputs[0], 0, &rets[0], &seqs[0]));
    CHECK(nrta_execute_schedule(model, inputs, async_outputs[0], 0, &rets[1], &seqs[1]));
    CHECK(nrt_tensor_check_output_completion(outs[0], 10 * 1000 * 1000, 3));

    /* A tensor freed while a thread waits for it: the wait ends, NRT_INVALID. */
    {
        struct waiter w;
        nrt_tensor_t *doomed = NULL;
        CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "doomed", &doomed));
        start_waiter(&w, doomed);
        nrt_tensor_free(&doomed);
        ASSERT(pthread_join(w.thread, NULL) == 0);
        ASSERT(w.status == NRT_INVALID);
    }

    /* NULL and a freed handle. */
    EXPECT(nrt_tensor_check_output_completion(NULL, 0, 0), NRT_INVALID);
    EXPECT(nrt_tensor_reset_output_completion(NULL), NRT_INVALID);
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 8, "freed", &freed));
    {
        nrt_tensor_t *stale = freed;
        nrt_tensor_free(&freed);
        EXPECT(nrt_tensor_check_output_completion(stale, 0, 0), NRT_INVALID);
        EXPECT(nrt_tensor_reset_output_completion(stale), NRT_INVALID);
    }

    for (i = 0; i < ASYNC; i++) {
        bool done = false;
        while (i < 2 && !done) {
            CHECK(nrta_is_completed(seqs[i], &done));
        }
        nrt_destroy_tensor_set(&async_outputs[i]);
        nrt_tensor_free(&outs[i]);
    }
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    nrt_destroy_tensor_set(&host_outputs);
    nrt_destroy_tensor_set(&slice_outputs);
    nrt_tensor_free(&slice);
    nrt_tensor_free(&big);
    nrt_tensor_free(&host_out);
    nrt_tensor_free(&out);
    nrt_tensor_free(&in);
}

int main(int argc, char **argv) {
    size_t size = 0;
    void *bytes;
    nrt_model_t *model = NULL;

    ASSERT(argc == 2);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    bytes = read_file(argv[1], &size);
    CHECK(nrt_load(bytes, size, 0, -1, &model));
    batches();
    completions(model);
    CHECK(nrt_unload(model));
    free(bytes);
    /* nrt_close while a thread waits: the wait ends, NRT_CLOSED; the tensor can still be freed. */
    {
        struct waiter w;
        nrt_tensor_t *last = NULL;
        CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "last", &last));
        start_waiter(&w, last);
        nrt_close();
        ASSERT(pthread_join(w.thread, NULL) == 0);
        ASSERT(w.status == NRT_CLOSED);
        nrt_tensor_free(&last);
    }
    printf("OUTPUTS OK\n");
    return 0;
}
