/*
 * A program that closes its standard streams (a daemon, `prog <&- >&- 2>&-`) and then uses
 * the runtime: nrt_init opens /dev/null on the closed descriptors 0, 1 and 2 before making
 * any of its own, so none of the runtime's eventfds, sockets or pipes takes a stream's
 * number (a printf into fd 1 went into a runtime eventfd). Reports on a duplicate of the
 * original stdout.
 * Usage: closed_stdio MODEL (an identity model over 512 bytes)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nrt/nrt.h"

static int report = -1;

#define REQUIRE(cond)                                                                    \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            dprintf(report, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond);           \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

/* Whether descriptor `fd` is open on /dev/null. */
static int on_dev_null(int fd) {
    char link[64], target[256];
    ssize_t n;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, target, sizeof target - 1);
    if (n < 0) {
        return 0;
    }
    target[n] = '\0';
    return strcmp(target, "/dev/null") == 0;
}

int main(int argc, char **argv) {
    static char in_bytes[512], out_bytes[512];
    FILE *f;
    long len;
    void *neff;
    nrt_model_t *model = NULL;
    nrt_tensor_t *in = NULL, *out = NULL;
    nrt_tensor_set_t *inputs = NULL, *outputs = NULL;
    int i;
    if (argc != 2) {
        return 2;
    }
    f = fopen(argv[1], "rb");
    if (!f || fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) <= 0) {
        return 2;
    }
    neff = malloc((size_t)len);
    rewind(f);
    if (!neff || fread(neff, 1, (size_t)len, f) != (size_t)len) {
        return 2;
    }
    fclose(f);
    report = dup(1);
    if (report < 3) {
        return 2;
    }
    close(0);
    close(1);
    close(2);
    REQUIRE(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", "") == NRT_SUCCESS);
    REQUIRE(on_dev_null(0) && on_dev_null(1) && on_dev_null(2));
    REQUIRE(nrt_load(neff, (size_t)len, 0, -1, &model) == NRT_SUCCESS);
    REQUIRE(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 512, "input", &in) == NRT_SUCCESS);
    REQUIRE(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 512, "output", &out) ==
            NRT_SUCCESS);
    REQUIRE(nrt_allocate_tensor_set(&inputs) == NRT_SUCCESS);
    REQUIRE(nrt_allocate_tensor_set(&outputs) == NRT_SUCCESS);
    REQUIRE(nrt_add_tensor_to_tensor_set(inputs, "input", in) == NRT_SUCCESS);
    REQUIRE(nrt_add_tensor_to_tensor_set(outputs, "output", out) == NRT_SUCCESS);
    for (i = 0; i < 512; i++) {
        in_bytes[i] = (char)(i * 7 + 1);
    }
    REQUIRE(nrt_tensor_write(in, in_bytes, 0, sizeof in_bytes) == NRT_SUCCESS);
    for (i = 0; i < 5; i++) {
        /* What the program prints goes to /dev/null, not into the runtime. */
        printf("execution %d\n", i);
        fflush(stdout);
        REQUIRE(nrt_execute(model, inputs, outputs) == NRT_SUCCESS);
    }
    REQUIRE(nrt_tensor_read(out, out_bytes, 0, sizeof out_bytes) == NRT_SUCCESS);
    REQUIRE(memcmp(in_bytes, out_bytes, sizeof in_bytes) == 0);
    nrt_close();
    dprintf(report, "CLOSED STDIO OK\n");
    return 0;
}
