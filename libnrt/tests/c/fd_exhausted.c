/*
 * A program that runs out of file descriptors after nrt_init (a server with many sockets
 * open): a device tensor's memory reaches the runtime as a memfd passed by SCM_RIGHTS, which
 * the kernel drops when the process has no descriptor left. The allocation must fail with
 * NRT_RESOURCE (the runtime's message names the open-file limit), and succeed once
 * descriptors are free again; the tensor then round-trips its bytes.
 * Usage: fd_exhausted
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common.h"
#include "nrt/nrt.h"

#define MAX_HELD 4096

int main(void) {
    static int held[MAX_HELD];
    static char in_bytes[4096], out_bytes[4096];
    struct rlimit lim;
    nrt_tensor_t *t = NULL;
    int n = 0, i;
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    /* A limit small enough to exhaust, above what the runtime already holds; its private
     * simdev, already running, keeps its own. */
    ASSERT(getrlimit(RLIMIT_NOFILE, &lim) == 0);
    lim.rlim_cur = 256;
    ASSERT(setrlimit(RLIMIT_NOFILE, &lim) == 0);
    for (;;) {
        int fd = dup(0);
        if (fd < 0) {
            ASSERT(errno == EMFILE);
            break;
        }
        ASSERT(n < MAX_HELD);
        held[n++] = fd;
    }
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 4096, "starved", &t),
           NRT_RESOURCE);
    ASSERT(t == NULL);
    for (i = 0; i < 16 && n > 0; i++) {
        close(held[--n]);
    }
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 4096, "fed", &t));
    for (i = 0; i < 4096; i++) {
        in_bytes[i] = (char)(i * 13 + 5);
    }
    CHECK(nrt_tensor_write(t, in_bytes, 0, sizeof in_bytes));
    CHECK(nrt_tensor_read(t, out_bytes, 0, sizeof out_bytes));
    ASSERT(memcmp(in_bytes, out_bytes, sizeof in_bytes) == 0);
    nrt_tensor_free(&t);
    while (n > 0) {
        close(held[--n]);
    }
    nrt_close();
    printf("FD EXHAUSTED OK\n");
    return 0;
}
