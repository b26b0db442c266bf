/*
 * nrt_close with explicit async requests in flight: every request accepted before or during the
 * close gets its `ret` written, and the eventfds registered for it are signalled exactly.
 * Usage: close_in_flight MODEL fds|threads|two|address (MODEL: an identity model over MODEL_BYTES bytes,
 * slow enough that requests are still in flight when nrt_close is called)
 *
 * fds:     one thread schedules executions until NRT_QUEUE_FULL, registers an eventfd for the
 *          last one's sequence id and one for the COMPUTE XU, and closes: after nrt_close every
 *          `ret` is NRT_SUCCESS, the sequence eventfd holds 1 and the XU eventfd exactly one
 *          count per request (none for the runtime's own STOP).
 * threads: two threads schedule executions and tensor reads in a loop (NRT_QUEUE_FULL retried)
 *          while the main thread calls nrt_close: each thread's loop ends with NRT_CLOSED, and
 *          every request either call accepted has its `ret` written by the time nrt_close
 *          returns.
 * two:     as fds, but two threads call nrt_close at once: whichever returns first, every `ret`
 *          is written and both eventfds hold their counts when it does (the second close waits
 *          for the first's drain, it does not return early).
 * address: eight threads call the entry points that find device memory by address
 *          (nrt_get_dmabuf_fd, nrt_memcpy_to_device) in a loop while the main thread calls
 *          nrt_close: each loop ends with NRT_CLOSED, never with the device gone under a call
 *          the close did not wait for.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "nrt/nrt.h"
#include "nrt/nrt_async.h"
#include "nrt/nrt_experimental.h"
#include "common.h"

#define MODEL_BYTES (4u << 20)
#define READ_BYTES 4096u
#define MAX_REQS 100000
#define UNWRITTEN ((NRT_STATUS)0xDEAD)
/* More threads than this machine's CPUs: some are preempted inside their calls when the close
 * comes, as a loaded machine does to any. */
#define ADDRESS_THREADS 8

static nrt_model_t *model;
static nrt_tensor_set_t *inputs, *outputs;
static nrt_tensor_t *in, *out;

static void setup(const char *path) {
    size_t size;
    void *neff = read_file(path, &size);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    CHECK(nrt_load(neff, size, 0, 1, &model));
    free(neff);
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, MODEL_BYTES, "input", &in));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, MODEL_BYTES, "output", &out));
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_allocate_tensor_set(&outputs));
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "input", in));
    CHECK(nrt_add_tensor_to_tensor_set(outputs, "output", out));
}

static uint64_t eventfd_count(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    uint64_t count = 0;
    if (poll(&p, 1, 5000) != 1) {
        return 0;
    }
    ASSERT(read(fd, &count, sizeof count) == (ssize_t)sizeof count);
    return count;
}

struct closer {
    pthread_barrier_t *together;
    const NRT_STATUS *rets;
    int n;
    int unwritten; /* rets still UNWRITTEN when this thread's nrt_close returned */
};

static void *close_together(void *arg) {
    struct closer *c = arg;
    int i;
    pthread_barrier_wait(c->together);
    nrt_close();
    for (i = 0; i < c->n; i++) {
        if (c->rets[i] == UNWRITTEN) {
            c->unwritten++;
        }
    }
    return NULL;
}

/* Both closers, started together; 0 when each saw every ret written on return. */
static int close_twice(const NRT_STATUS *rets, int n) {
    pthread_barrier_t together;
    struct closer c[2] = {{&together, rets, n, 0}, {&together, rets, n, 0}};
    pthread_t t[2];
    int k;
    ASSERT(pthread_barrier_init(&together, NULL, 2) == 0);
    for (k = 0; k < 2; k++) {
        ASSERT(pthread_create(&t[k], NULL, close_together, &c[k]) == 0);
    }
    for (k = 0; k < 2; k++) {
        ASSERT(pthread_join(t[k], NULL) == 0);
    }
    pthread_barrier_destroy(&together);
    for (k = 0; k < 2; k++) {
        if (c[k].unwritten) {
            fprintf(stderr, "closer %d: %d of %d rets unwritten when its nrt_close returned\n", k,
                    c[k].unwritten, n);
            return 1;
        }
    }
    return 0;
}

static int fds_mode(int two_closers) {
    static NRT_STATUS rets[64];
    nrta_seq_t seqs[64];
    int n = 0, i;
    int seq_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int xu_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    uint64_t count;
    ASSERT(seq_fd >= 0 && xu_fd >= 0);
    CHECK(nrta_event_register_xu_completion(0, NRTA_XU_COMPUTE, 0, xu_fd));
    for (;;) {
        NRT_STATUS s;
        ASSERT(n < 64);
        rets[n] = UNWRITTEN;
        s = nrta_execute_schedule(model, inputs, outputs, 0, &rets[n], &seqs[n]);
        if (s == NRT_QUEUE_FULL) {
            break;
        }
        CHECK(s);
        n++;
    }
    ASSERT(n >= 2);
    CHECK(nrta_event_register_seq_id_completion(seqs[n - 1], seq_fd));
    if (two_closers) {
        if (close_twice(rets, n)) {
            return 1;
        }
    } else {
        nrt_close();
    }
    for (i = 0; i < n; i++) {
        if (rets[i] != NRT_SUCCESS) {
            fprintf(stderr, "request %d of %d: ret %d after nrt_close\n", i, n, (int)rets[i]);
            return 1;
        }
    }
    count = eventfd_count(seq_fd);
    if (count != 1) {
        fprintf(stderr, "the last request's sequence eventfd holds %llu after nrt_close, not 1\n",
                (unsigned long long)count);
        return 1;
    }
    count = eventfd_count(xu_fd);
    if (count != (uint64_t)n) {
        fprintf(stderr, "the XU eventfd counted %llu completions of %d requests\n",
                (unsigned long long)count, n);
        return 1;
    }
    printf("CLOSE %s OK %d requests\n", two_closers ? "TWO" : "FDS", n);
    return 0;
}

struct scheduler {
    int reads; /* tensor reads, else executions */
    NRT_STATUS *rets;
    int accepted;
    NRT_STATUS last; /* the status that ended the loop */
};

static void *schedule_loop(void *arg) {
    struct scheduler *s = arg;
    static char buffers[2][READ_BYTES];
    for (;;) {
        NRT_STATUS st;
        nrta_seq_t seq;
        if (s->accepted == MAX_REQS) {
            s->last = NRT_SUCCESS;
            return NULL;
        }
        s->rets[s->accepted] = UNWRITTEN;
        st = s->reads ? nrta_tensor_read(buffers[s->accepted % 2], out, 0, READ_BYTES, 0, 0,
                                         &s->rets[s->accepted], &seq)
                      : nrta_execute_schedule(model, inputs, outputs, 0,
                                              &s->rets[s->accepted], &seq);
        if (st == NRT_QUEUE_FULL) {
            continue;
        }
        if (st != NRT_SUCCESS) {
            s->last = st;
            return NULL;
        }
        s->accepted++;
    }
}

static int threads_mode(void) {
    static NRT_STATUS exec_rets[MAX_REQS], read_rets[MAX_REQS];
    struct scheduler s[2] = {{0, exec_rets, 0, NRT_SUCCESS}, {1, read_rets, 0, NRT_SUCCESS}};
    pthread_t t[2];
    struct timespec pause = {0, 30 * 1000 * 1000};
    int k, i, bad = 0;
    for (k = 0; k < 2; k++) {
        ASSERT(pthread_create(&t[k], NULL, schedule_loop, &s[k]) == 0);
    }
    nanosleep(&pause, NULL);
    nrt_close();
    for (k = 0; k < 2; k++) {
        const char *what = k ? "read" : "execution";
        /* Every request accepted so far must have its ret written: nrt_close has returned. A
         * call still running now started after the close and must end with NRT_CLOSED. */
        ASSERT(pthread_join(t[k], NULL) == 0);
        if (s[k].last != NRT_CLOSED) {
            fprintf(stderr, "the %s loop ended with %d, not NRT_CLOSED\n", what, (int)s[k].last);
            return 1;
        }
        for (i = 0; i < s[k].accepted; i++) {
            if (s[k].rets[i] == UNWRITTEN) {
                bad++;
            }
        }
        if (bad) {
            fprintf(stderr, "%d of %d accepted %ss have no ret after nrt_close\n", bad,
                    s[k].accepted, what);
            return 1;
        }
        ASSERT(s[k].accepted > 0);
    }
    printf("CLOSE THREADS OK %d executions %d reads\n", s[0].accepted, s[1].accepted);
    return 0;
}

struct by_address {
    int memcpy; /* nrt_memcpy_to_device, else nrt_get_dmabuf_fd */
    int calls;
    NRT_STATUS last;
};

static void *address_loop(void *arg) {
    struct by_address *a = arg;
    static char bytes[2][64];
    void *va = nrt_tensor_get_va(in);
    for (;;) {
        NRT_STATUS st;
        int fd = -1;
        st = a->memcpy ? nrt_memcpy_to_device(va, bytes[a->calls % 2], sizeof bytes[0])
                       : nrt_get_dmabuf_fd((uint64_t)(uintptr_t)va, MODEL_BYTES, &fd);
        if (fd >= 0) {
            close(fd);
        }
        if (st != NRT_SUCCESS) {
            a->last = st;
            return NULL;
        }
        a->calls++;
    }
}

static int address_mode(void) {
    struct by_address a[ADDRESS_THREADS];
    pthread_t t[ADDRESS_THREADS];
    int dmabufs = 0;
    struct timespec pause = {0, 30 * 1000 * 1000};
    int k;
    ASSERT(nrt_tensor_get_va(in) != NULL);
    for (k = 0; k < ADDRESS_THREADS; k++) {
        a[k].memcpy = k == 0;
        a[k].calls = 0;
        a[k].last = NRT_SUCCESS;
    }
    for (k = 0; k < ADDRESS_THREADS; k++) {
        ASSERT(pthread_create(&t[k], NULL, address_loop, &a[k]) == 0);
    }
    nanosleep(&pause, NULL);
    nrt_close();
    for (k = 0; k < ADDRESS_THREADS; k++) {
        const char *what = a[k].memcpy ? "nrt_memcpy_to_device" : "nrt_get_dmabuf_fd";
        ASSERT(pthread_join(t[k], NULL) == 0);
        if (a[k].last != NRT_CLOSED) {
            fprintf(stderr, "the %s loop ended with %d after %d calls, not NRT_CLOSED\n", what,
                    (int)a[k].last, a[k].calls);
            return 1;
        }
        ASSERT(a[k].calls > 0);
        dmabufs += a[k].memcpy ? 0 : a[k].calls;
    }
    printf("CLOSE ADDRESS OK %d dma-bufs %d copies\n", dmabufs, a[0].calls);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL fds|threads|two|address\n", argv[0]);
        return 2;
    }
    setup(argv[1]);
    if (strcmp(argv[2], "fds") == 0) {
        return fds_mode(0);
    }
    if (strcmp(argv[2], "two") == 0) {
        return fds_mode(1);
    }
    if (strcmp(argv[2], "threads") == 0) {
        return threads_mode();
    }
    if (strcmp(argv[2], "address") == 0) {
        return address_mode();
    }
    fprintf(stderr, "unknown mode %s\n", argv[2]);
    return 2;
}
