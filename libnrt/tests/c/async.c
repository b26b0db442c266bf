/*
 * The implicit asynchronous mode from C (NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS > 0):
 * nrt_execute queues, the registered callback reports each completion with its context
 * pointer, nrt_async_drain_queued_execs waits for all. From inside the callback (the runtime's
 * exec thread) a drain is refused (NRT_INVALID) and nrt_close changes nothing, rather than
 * waiting for themselves. Usage: async MODEL
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "nrt/nrt.h"
#include "nrt/nrt_experimental.h"
#include "common.h"

#define EXECUTIONS 20

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int completed, failed;
/* The first completion tries what would deadlock on the exec thread. */
static int tried;
static NRT_STATUS drain_inside = (NRT_STATUS)0xDEAD;

static void on_done(void *params, uint32_t model_id, uint32_t vnc, uint64_t job_id,
                    NRT_STATUS status) {
    (void)model_id;
    (void)job_id;
    pthread_mutex_lock(&lock);
    if (!tried) {
        tried = 1;
        drain_inside = nrt_async_drain_queued_execs(0);
        nrt_close(); /* refused: logged, the runtime stays open */
    }
    if (params == (void *)&completed && vnc == 0 && status == NRT_SUCCESS) {
        completed++;
    } else {
        failed++;
    }
    pthread_mutex_unlock(&lock);
}

int main(int argc, char **argv) {
    size_t size = 0;
    void *bytes;
    nrt_model_t *model = NULL;
    nrt_tensor_t *in = NULL, *out = NULL;
    nrt_tensor_set_t *inputs = NULL, *outputs = NULL;
    unsigned char buf[512];
    int i, done;

    ASSERT(argc == 2);
    EXPECT(nrt_register_async_exec_callback(on_done, &completed), NRT_UNINITIALIZED);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    EXPECT(nrt_register_async_exec_callback(NULL, NULL), NRT_INVALID);
    CHECK(nrt_register_async_exec_callback(on_done, &completed));
    bytes = read_file(argv[1], &size);
    CHECK(nrt_load(bytes, size, 0, -1, &model));
    free(bytes);
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 512, "in", &in));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 512, "out", &out));
    memset(buf, 0x3C, sizeof buf);
    CHECK(nrt_tensor_write(in, buf, 0, sizeof buf));
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_allocate_tensor_set(&outputs));
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "input", in));
    CHECK(nrt_add_tensor_to_tensor_set(outputs, "output", out));
    for (i = 0; i < EXECUTIONS; i++) {
        NRT_STATUS s = nrt_execute(model, inputs, outputs);
        if (s == NRT_QUEUE_FULL) {
            CHECK(nrt_async_drain_queued_execs(0));
            i--;
            continue;
        }
        CHECK(s);
    }
    EXPECT(nrt_async_drain_queued_execs(-1), NRT_INVALID);
    CHECK(nrt_async_drain_queued_execs(0));
    pthread_mutex_lock(&lock);
    done = completed;
    pthread_mutex_unlock(&lock);
    ASSERT(done == EXECUTIONS && failed == 0);
    ASSERT(tried && drain_inside == NRT_INVALID);
    memset(buf, 0, sizeof buf);
    CHECK(nrt_tensor_read(out, buf, 0, sizeof buf));
    ASSERT(buf[0] == 0x3C && buf[511] == 0x3C);
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    nrt_tensor_free(&in);
    nrt_tensor_free(&out);
    CHECK(nrt_unload(model));
    nrt_close();
    printf("ASYNC OK %d\n", done);
    return 0;
}
