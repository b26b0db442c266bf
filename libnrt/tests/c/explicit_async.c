/*
 * The explicit asynchronous API (3.x) from C: a COMPUTE queue filled until NRT_QUEUE_FULL (which
 * changes nothing: the next schedule after a completion gets the next sequence number),
 * nrta_is_completed polled, a seq-id eventfd waited on with poll(2), `ret` written before the
 * completion is reported by any channel, nrta_get_sequence equal to the last completed request,
 * an XU completion eventfd counting exactly the completions, nrt_tensor_free refused while a
 * scheduled request uses the tensor, and bad input refused with nothing changed.
 * Usage: explicit_async SLOW_MODEL (an identity model over SLOW_BYTES bytes)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "nrt/nrt.h"
#include "nrt/nrt_async.h"
#include "common.h"

#define SLOW_BYTES (4u << 20)
#define MAX_REQS 512
#define UNWRITTEN ((NRT_STATUS)0xDEAD)

static nrt_model_t *model;
static nrt_tensor_set_t *inputs, *outputs;
static NRT_STATUS rets[MAX_REQS];
static nrta_seq_t seqs[MAX_REQS];
static int scheduled; /* requests scheduled so far (indices into rets/seqs) */

/* Whether `seq` completed; every completed request's `ret` must be written by then. */
static int completed(int i) {
    bool done = false;
    CHECK(nrta_is_completed(seqs[i], &done));
    if (done && rets[i] == UNWRITTEN) {
        fprintf(stderr, "request %d reported complete before its ret was written\n", i);
        exit(1);
    }
    return done;
}

/* nrta_get_sequence, checking that every request up to it has its `ret` written. */
static nrta_seq_t last_completed(void) {
    nrta_seq_t last = 0;
    int i;
    CHECK(nrta_get_sequence(0, NRTA_XU_COMPUTE, 0, &last));
    for (i = 0; i < scheduled; i++) {
        if (NRTA_SEQ_GET_SEQ_NUM(seqs[i]) <= NRTA_SEQ_GET_SEQ_NUM(last) && rets[i] == UNWRITTEN) {
            fprintf(stderr, "request %d is within nrta_get_sequence but its ret is unwritten\n", i);
            exit(1);
        }
    }
    return last;
}

/* Schedules one execution; NRT_SUCCESS or NRT_QUEUE_FULL (which must change nothing). */
static NRT_STATUS schedule(void) {
    NRT_STATUS s;
    ASSERT(scheduled < MAX_REQS);
    rets[scheduled] = UNWRITTEN;
    seqs[scheduled] = 0xFEEDu;
    s = nrta_execute_schedule(model, inputs, outputs, 0, &rets[scheduled], &seqs[scheduled]);
    if (s == NRT_QUEUE_FULL) {
        ASSERT(rets[scheduled] == UNWRITTEN && seqs[scheduled] == 0xFEEDu);
        return s;
    }
    CHECK(s);
    if (scheduled > 0) {
        /* Sequence numbers are consecutive on the XU: a refusal used none. */
        ASSERT(NRTA_SEQ_GET_SEQ_NUM(seqs[scheduled]) == NRTA_SEQ_GET_SEQ_NUM(seqs[scheduled - 1]) + 1);
        ASSERT(NRTA_SEQ_GET_XU_ID(seqs[scheduled]) == NRTA_SEQ_GET_XU_ID(seqs[0]));
    }
    scheduled++;
    return s;
}

/* Polls nrta_is_completed until request `i` completes. */
static void spin_until_completed(int i) {
    while (!completed(i)) {
        (void)last_completed();
    }
}

/* Schedules until the queue is full; returns how many were accepted. */
static int fill(void) {
    int n = 0;
    while (schedule() != NRT_QUEUE_FULL) {
        n++;
        if (n > 300) {
            fprintf(stderr, "no NRT_QUEUE_FULL after %d schedules\n", n);
            exit(1);
        }
    }
    return n;
}

static uint64_t read_count(int fd) {
    uint64_t v = 0;
    ASSERT(read(fd, &v, sizeof v) == (ssize_t)sizeof v);
    return v;
}

static int readable(int fd, int timeout_ms) {
    struct pollfd p;
    p.fd = fd;
    p.events = POLLIN;
    p.revents = 0;
    return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

int main(int argc, char **argv) {
    size_t size = 0;
    void *bytes;
    nrt_tensor_t *in = NULL, *out = NULL, *host = NULL, *small = NULL;
    nrt_tensor_set_t *host_set = NULL;
    nrta_seq_t seq = 0xFEEDu, last = 0, bogus;
    NRT_STATUS ret = UNWRITTEN;
    bool done = false;
    int i, accepted, xu_fd, seq_fd, other_fd, pipe_fds[2];
    uint64_t xu_total = 0, xu_expected;
    unsigned char byte = 7;

    ASSERT(argc == 2);
    EXPECT(nrta_is_completed(0, &done), NRT_UNINITIALIZED);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    bytes = read_file(argv[1], &size);
    CHECK(nrt_load(bytes, size, 0, -1, &model));
    free(bytes);
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, SLOW_BYTES, "in", &in));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, SLOW_BYTES, "out", &out));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, 0, SLOW_BYTES, "host", &host));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 64, "small", &small));
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_allocate_tensor_set(&outputs));
    CHECK(nrt_allocate_tensor_set(&host_set));
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "input", in));
    CHECK(nrt_add_tensor_to_tensor_set(outputs, "output", out));
    CHECK(nrt_add_tensor_to_tensor_set(host_set, "input", host));

    /* An XU completion eventfd counts every completion from its registration on. */
    xu_fd = eventfd(0, EFD_NONBLOCK);
    ASSERT(xu_fd >= 0);
    CHECK(nrta_event_register_xu_completion(0, NRTA_XU_COMPUTE, 0, xu_fd));

    /* Fill the COMPUTE queue until NRT_QUEUE_FULL; the refusal changed nothing. */
    accepted = fill();
    ASSERT(accepted >= 2);
    /* A tensor a scheduled request uses is not freed: the handle stays. */
    nrt_tensor_free(&in);
    ASSERT(in != NULL);
    /* After one completion, the next schedule gets the next sequence number. */
    spin_until_completed(0);
    while (schedule() == NRT_QUEUE_FULL) {
        (void)last_completed();
    }
    /* Every request: completion polled, `ret` written by then. */
    for (i = 0; i < scheduled; i++) {
        spin_until_completed(i);
        ASSERT(rets[i] == NRT_SUCCESS);
    }
    last = last_completed();
    ASSERT(last == seqs[scheduled - 1]);

    /* A seq-id eventfd, waited on with poll(2): `ret` is written when it fires. */
    seq_fd = eventfd(0, 0);
    ASSERT(seq_fd >= 0);
    CHECK(schedule());
    CHECK(nrta_event_register_seq_id_completion(seqs[scheduled - 1], seq_fd));
    ASSERT(readable(seq_fd, 30000));
    ASSERT(rets[scheduled - 1] == NRT_SUCCESS);
    ASSERT(read_count(seq_fd) == 1);
    ASSERT(completed(scheduled - 1));
    ASSERT(last_completed() == seqs[scheduled - 1]);
    /* An already completed request signals at once. */
    CHECK(nrta_event_register_seq_id_completion(seqs[0], seq_fd));
    ASSERT(readable(seq_fd, 0));
    ASSERT(read_count(seq_fd) == 1);
    /* A deregistered eventfd is not signalled (when the request was still running). */
    other_fd = eventfd(0, EFD_NONBLOCK);
    ASSERT(other_fd >= 0);
    accepted = fill();
    CHECK(nrta_event_register_seq_id_completion(seqs[scheduled - 1], other_fd));
    CHECK(nrta_event_register_seq_id_completion(seqs[scheduled - 1], -1));
    for (i = 0; i < scheduled; i++) {
        spin_until_completed(i);
    }
    if (!readable(other_fd, 0)) {
        printf("deregistered eventfd stayed quiet\n");
    } else {
        /* Only possible if the request completed before the deregistration. */
        printf("request completed before its deregistration\n");
    }

    /* The XU eventfd counted exactly the completions since its registration. */
    xu_expected = (uint64_t)scheduled;
    while (xu_total < xu_expected && readable(xu_fd, 30000)) {
        xu_total += read_count(xu_fd);
    }
    ASSERT(xu_total == xu_expected);
    ASSERT(!readable(xu_fd, 50));
    /* Deregistered: the next completion is not counted. */
    CHECK(nrta_event_register_xu_completion(0, NRTA_XU_COMPUTE, 0, -1));
    CHECK(schedule());
    spin_until_completed(scheduled - 1);
    ASSERT(!readable(xu_fd, 50));

    /* Bad input: refused with NRT_INVALID, `ret` and the sequence untouched. */
    EXPECT(nrta_execute_schedule(model, inputs, outputs, 0, NULL, &seq), NRT_INVALID);
    EXPECT(nrta_execute_schedule(model, inputs, outputs, 0, &ret, NULL), NRT_INVALID);
    EXPECT(nrta_execute_schedule(model, inputs, outputs, 1, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_execute_schedule(model, host_set, outputs, 0, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_execute_schedule((nrt_model_t *)&ret, inputs, outputs, 0, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_tensor_write(small, &byte, 0, 1, 0, 2, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_tensor_write(small, &byte, 0, 1, 0, -1, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_tensor_write(small, &byte, 0, 1, 7, 0, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_tensor_write(small, &byte, 64, 1, 0, 0, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_tensor_write(small, NULL, 0, 1, 0, 0, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_tensor_write(host, &byte, 0, 1, 0, 0, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_tensor_write(small, &byte, 0, 1, 0, 0, NULL, &seq), NRT_INVALID);
    EXPECT(nrta_tensor_read(&byte, host, 0, 1, 0, 1, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_tensor_read(NULL, small, 0, 1, 0, 1, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_tensor_read(&byte, small, 0, 1, 0, 1, &ret, NULL), NRT_INVALID);
    EXPECT(nrta_tensor_copy(host, 0, small, 0, 1, 0, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_tensor_copy(small, 0, small, 0, 1, 3, &ret, &seq), NRT_INVALID);
    ASSERT(ret == UNWRITTEN && seq == 0xFEEDu);
    EXPECT(nrta_is_completed(seqs[0], NULL), NRT_INVALID);
    /* A sequence id of another XU (TENSOR_OP queue 1, which ran nothing yet). */
    bogus = ((uint64_t)((1u << 4) | NRTA_XU_TENSOR_OP) << 48) | 5; /* xu_id {type:4, queue:4, lnc:8} */
    EXPECT(nrta_is_completed(bogus, &done), NRT_INVALID);
    /* A sequence id of an XU this process does not have (logical core 200). */
    EXPECT(nrta_is_completed(((uint64_t)((200u << 8) | NRTA_XU_COMPUTE) << 48) | 1, &done), NRT_INVALID);
    EXPECT(nrta_event_register_seq_id_completion(bogus, seq_fd), NRT_INVALID);
    /* A request beyond the last submitted of its own XU. */
    EXPECT(nrta_is_completed(seqs[scheduled - 1] + 100, &done), NRT_INVALID);
    EXPECT(nrta_get_sequence(0, (nrta_xu_t)7, 0, &seq), NRT_INVALID);
    EXPECT(nrta_get_sequence(0, NRTA_XU_COMPUTE, 1, &seq), NRT_INVALID);
    EXPECT(nrta_get_sequence(0, NRTA_XU_TENSOR_OP, -1, &seq), NRT_INVALID);
    EXPECT(nrta_get_sequence(99, NRTA_XU_COMPUTE, 0, &seq), NRT_INVALID);
    EXPECT(nrta_get_sequence(0, NRTA_XU_COMPUTE, 0, NULL), NRT_INVALID);
    ASSERT(seq == 0xFEEDu);
    EXPECT(nrta_event_register_xu_completion(-1, NRTA_XU_COMPUTE, 0, xu_fd), NRT_INVALID);
    EXPECT(nrta_event_register_xu_completion(0, NRTA_XU_TENSOR_OP, 2, xu_fd), NRT_INVALID);
    EXPECT(nrta_event_register_xu_completion(0, NRTA_XU_COMPUTE, 0, -5), NRT_INVALID);
    ASSERT(pipe(pipe_fds) == 0);
    EXPECT(nrta_event_register_xu_completion(0, NRTA_XU_COMPUTE, 0, pipe_fds[1]), NRT_INVALID);
    EXPECT(nrta_event_register_seq_id_completion(seqs[0], pipe_fds[1]), NRT_INVALID);
    {
        /* Collectives build and are refused, naming why; nothing is written. */
        uint32_t group[1] = {0};
        nrt_cc_comm_t comm = {group, 0, 1, 0, 1, 0};
        nrt_tensor_list_t list = {&in, 1};
        nrt_cc_context_t *ctx = NULL;
        NRT_STATUS cc_ret = UNWRITTEN;
        EXPECT(nrta_cc_prepare(&comm, &list, &list, NRT_DTYPE_FLOAT32, NRT_OP_ADD,
                               NRT_CC_ALLREDUCE, &ctx),
               NRT_INVALID);
        ASSERT(ctx == NULL);
        EXPECT(nrta_cc_prepare(&comm, &list, &list, NRT_DTYPE_FLOAT32, NRT_OP_ADD,
                               NRT_CC_ALLREDUCE, NULL),
               NRT_INVALID);
        EXPECT(nrta_cc_schedule(&ctx, 0, &cc_ret, &bogus), NRT_INVALID);
        ASSERT(cc_ret == UNWRITTEN);
    }
    /* Nothing changed: the queue still takes work, with the next sequence number. */
    CHECK(schedule());
    spin_until_completed(scheduled - 1);
    ASSERT(rets[scheduled - 1] == NRT_SUCCESS);

    /* Caller-owned eventfds are still open: the library closed only its duplicates. */
    ASSERT(fcntl(xu_fd, F_GETFD) != -1 && fcntl(seq_fd, F_GETFD) != -1 &&
           fcntl(other_fd, F_GETFD) != -1);
    nrt_tensor_free(&in);
    ASSERT(in == NULL);
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    nrt_destroy_tensor_set(&host_set);
    nrt_tensor_free(&out);
    nrt_tensor_free(&host);
    nrt_tensor_free(&small);
    CHECK(nrt_unload(model));
    nrt_close();
    close(xu_fd);
    close(seq_fd);
    close(other_fd);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    printf("EXPLICIT ASYNC OK %d requests\n", scheduled);
    return 0;
}
