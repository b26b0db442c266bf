/*
 * The serving pattern from C, as first-party serving code writes it: for each step, write the
 * inputs on TENSOR_OP queue 0, wait on a seq-id eventfd, schedule the execution, wait, read the
 * outputs on TENSOR_OP queue 1, wait, check them; two steps in flight on every XU.
 * Usage: serving MODEL (the 512-byte identity model)
 */
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "nrt/nrt.h"
#include "nrt/nrt_async.h"
#include "common.h"

#define STEPS 200
#define IN_FLIGHT 2
#define BYTES 512

/* One step's pipeline slot. */
struct slot {
    nrt_tensor_t *in, *out;
    nrt_tensor_set_t *inputs, *outputs;
    unsigned char host_in[BYTES], host_out[BYTES];
    NRT_STATUS ret;
    nrta_seq_t seq;
    int efd;
};

/* Waits for every slot's request with poll(2) on its seq-id eventfd; checks its `ret`. */
static void wait_all(struct slot *s, int n) {
    struct pollfd p[IN_FLIGHT];
    int i, left = n;
    uint64_t v;
    for (i = 0; i < n; i++) {
        p[i].fd = s[i].efd;
        p[i].events = POLLIN;
        CHECK(nrta_event_register_seq_id_completion(s[i].seq, s[i].efd));
    }
    while (left > 0) {
        ASSERT(poll(p, (nfds_t)n, 30000) > 0);
        for (i = 0; i < n; i++) {
            if (p[i].fd >= 0 && (p[i].revents & POLLIN)) {
                ASSERT(read(p[i].fd, &v, sizeof v) == (ssize_t)sizeof v && v == 1);
                /* `ret` is written before the eventfd fires. */
                if (s[i].ret != NRT_SUCCESS) {
                    fprintf(stderr, "slot %d: ret %d\n", i, (int)s[i].ret);
                    exit(1);
                }
                p[i].fd = -1;
                left--;
            }
        }
    }
}

int main(int argc, char **argv) {
    size_t size = 0;
    void *bytes;
    nrt_model_t *model = NULL;
    struct slot s[IN_FLIGHT];
    int step, i, j, checked = 0;

    ASSERT(argc == 2);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    bytes = read_file(argv[1], &size);
    CHECK(nrt_load(bytes, size, 0, -1, &model));
    free(bytes);
    memset(s, 0, sizeof s);
    for (i = 0; i < IN_FLIGHT; i++) {
        CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "in", &s[i].in));
        CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "out", &s[i].out));
        CHECK(nrt_allocate_tensor_set(&s[i].inputs));
        CHECK(nrt_allocate_tensor_set(&s[i].outputs));
        CHECK(nrt_add_tensor_to_tensor_set(s[i].inputs, "input", s[i].in));
        CHECK(nrt_add_tensor_to_tensor_set(s[i].outputs, "output", s[i].out));
        s[i].efd = eventfd(0, 0);
        ASSERT(s[i].efd >= 0);
    }
    for (step = 0; step < STEPS; step += IN_FLIGHT) {
        for (i = 0; i < IN_FLIGHT; i++) {
            for (j = 0; j < BYTES; j++) {
                s[i].host_in[j] = (unsigned char)(step + i + j * 7);
            }
            memset(s[i].host_out, 0, BYTES);
            s[i].ret = (NRT_STATUS)0xDEAD;
            CHECK(nrta_tensor_write(s[i].in, s[i].host_in, 0, BYTES, 0, 0, &s[i].ret, &s[i].seq));
        }
        wait_all(s, IN_FLIGHT);
        for (i = 0; i < IN_FLIGHT; i++) {
            s[i].ret = (NRT_STATUS)0xDEAD;
            CHECK(nrta_execute_schedule(model, s[i].inputs, s[i].outputs, 0, &s[i].ret, &s[i].seq));
        }
        wait_all(s, IN_FLIGHT);
        for (i = 0; i < IN_FLIGHT; i++) {
            s[i].ret = (NRT_STATUS)0xDEAD;
            CHECK(nrta_tensor_read(s[i].host_out, s[i].out, 0, BYTES, 0, 1, &s[i].ret, &s[i].seq));
        }
        wait_all(s, IN_FLIGHT);
        for (i = 0; i < IN_FLIGHT; i++) {
            if (memcmp(s[i].host_in, s[i].host_out, BYTES) != 0) {
                fprintf(stderr, "step %d slot %d: output differs\n", step, i);
                return 1;
            }
            checked++;
        }
    }
    for (i = 0; i < IN_FLIGHT; i++) {
        nrt_destroy_tensor_set(&s[i].inputs);
        nrt_destroy_tensor_set(&s[i].outputs);
        nrt_tensor_free(&s[i].in);
        nrt_tensor_free(&s[i].out);
        ASSERT(s[i].in == NULL && s[i].out == NULL);
        close(s[i].efd);
    }
    CHECK(nrt_unload(model));
    nrt_close();
    printf("SERVING OK %d steps\n", checked);
    return 0;
}
