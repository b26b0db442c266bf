/*
 * nrt_init again after nrt_close, as a test suite that opens and closes a runtime per test
 * does: the second runtime loads and executes; a tensor or model of the first is refused by it
 * (NRT_INVALID, by handle or by address; a tensor can still be freed); a second nrt_init without a close is NRT_FAILURE.
 * NEURON_RT_LOG_LEVEL is read at each nrt_init, whatever was called before.
 * nrt_close stops the private simdev even while a tensor of it is still allocated, and gives
 * back the memory of tensors not freed: the process's shared memory shrinks by their size.
 * Usage: reinit MODEL (an identity model over 512 bytes)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "nrt/nrt.h"
#include "nrt/nrt_experimental.h"
#include "common.h"

#define BYTES 512u
#define KEPT_BYTES (64u << 20)

/* This process's resident shared memory (RssShmem in /proc/self/status), in KiB. */
static long rss_shmem_kib(void) {
    char line[256];
    long kib = -1;
    FILE *f = fopen("/proc/self/status", "r");
    ASSERT(f != NULL);
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "RssShmem: %ld kB", &kib) == 1) {
            break;
        }
    }
    fclose(f);
    ASSERT(kib >= 0);
    return kib;
}

/* Loads MODEL, executes it once on fresh tensors filled with `fill` and checks the output;
 * returns the input tensor (the rest is freed). */
static nrt_tensor_t *run_once(const void *neff, size_t size, unsigned char fill) {
    nrt_model_t *model = NULL;
    nrt_tensor_t *in = NULL, *out = NULL;
    nrt_tensor_set_t *inputs = NULL, *outputs = NULL;
    unsigned char want[BYTES], got[BYTES];
    CHECK(nrt_load(neff, size, 0, -1, &model));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "input", &in));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "output", &out));
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_allocate_tensor_set(&outputs));
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "input", in));
    CHECK(nrt_add_tensor_to_tensor_set(outputs, "output", out));
    memset(want, fill, sizeof want);
    CHECK(nrt_tensor_write(in, want, 0, sizeof want));
    CHECK(nrt_execute(model, inputs, outputs));
    CHECK(nrt_tensor_read(out, got, 0, sizeof got));
    ASSERT(memcmp(want, got, sizeof got) == 0);
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    nrt_tensor_free(&out);
    CHECK(nrt_unload(model));
    return in;
}

int main(int argc, char **argv) {
    size_t size = 0;
    void *neff;
    nrt_tensor_t *first, *second, *kept = NULL;
    long shmem_before, shmem_after;
    nrt_model_t *stale = NULL, *fresh = NULL;
    nrt_model_info_t info;
    size_t info_size = 0;
    unsigned char buf[BYTES];
    void *first_va;
    int fd = -1;
    uint64_t dmabuf_offset = 0;
    ASSERT(argc == 2);
    neff = read_file(argv[1], &size);
    /* A call before nrt_init, as a transfer library's probe does: the log level is still the
     * one nrt_init finds. */
    {
        uint32_t total = 0;
        CHECK(nrt_get_total_nc_count(&total));
        ASSERT(total > 0);
    }

    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    EXPECT(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""), NRT_FAILURE);
    CHECK(nrt_load(neff, size, 0, -1, &stale)); /* left loaded at close */
    first = run_once(neff, size, 0x31);
    first_va = nrt_tensor_get_va(first);
    ASSERT(first_va != NULL);
    /* Written whole, so its pages are resident here; never freed before close. */
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, KEPT_BYTES, "kept", &kept));
    CHECK(nrt_tensor_memset(kept, 0, 0x5A, KEPT_BYTES));
    shmem_before = rss_shmem_kib();
    ASSERT(shmem_before >= (long)(KEPT_BYTES >> 10));
    nrt_close();
    shmem_after = rss_shmem_kib();
    if (shmem_after > shmem_before - (long)(KEPT_BYTES >> 10) * 3 / 4) {
        fprintf(stderr, "nrt_close kept a tensor's memory: RssShmem %ld kB before, %ld kB after\n",
                shmem_before, shmem_after);
        return 1;
    }
    EXPECT(nrt_tensor_read(first, buf, 0, sizeof buf), NRT_CLOSED);
    EXPECT(nrt_tensor_read(kept, buf, 0, sizeof buf), NRT_CLOSED);
    nrt_tensor_free(&kept);
    ASSERT(kept == NULL);
    /* The private simdev nrt_init started is stopped (and reaped) by nrt_close, though a
     * tensor of it is still allocated: this process has no child left. */
    errno = 0;
    if (waitpid(-1, NULL, WNOHANG) != -1 || errno != ECHILD) {
        fprintf(stderr, "a child process outlived nrt_close\n");
        return 1;
    }

    /* NEURON_RT_LOG_LEVEL is read by each nrt_init (the test runs with "error"). */
    ASSERT(setenv("NEURON_RT_LOG_LEVEL", "info", 1) == 0);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    ASSERT(setenv("NEURON_RT_LOG_LEVEL", "error", 1) == 0);
    /* The new runtime's first model: the closed one's first had the same id inside. The
     * stale handle is refused, never taken for it. */
    CHECK(nrt_load(neff, size, 0, -1, &fresh));
    EXPECT(nrt_unload(stale), NRT_INVALID);
    EXPECT(nrt_get_model_info(stale, &info, sizeof info, &info_size), NRT_INVALID);
    CHECK(nrt_get_model_info(fresh, &info, sizeof info, &info_size));
    CHECK(nrt_unload(fresh));
    second = run_once(neff, size, 0x32);
    /* The first runtime's tensor is not this one's. */
    EXPECT(nrt_tensor_copy(first, 0, second, 0, sizeof buf), NRT_INVALID);
    EXPECT(nrt_tensor_read(first, buf, 0, sizeof buf), NRT_INVALID);
    /* Nor is its memory, found by address (as a transfer library does): refused as its handle
     * is, never written to memory the closed runtime's device let go of. */
    memset(buf, 0x77, sizeof buf);
    EXPECT(nrt_memcpy_to_device(first_va, buf, 16), NRT_INVALID);
    EXPECT(nrt_get_dmabuf_fd((uint64_t)(uintptr_t)first_va, BYTES, &fd), NRT_INVALID);
    EXPECT(nrt_get_dmabuf_fd_v2((uint64_t)(uintptr_t)first_va, 16, &fd, &dmabuf_offset),
           NRT_INVALID);
    ASSERT(fd == -1);
    nrt_tensor_free(&first);
    ASSERT(first == NULL);
    CHECK(nrt_tensor_read(second, buf, 0, sizeof buf));
    ASSERT(buf[0] == 0x32 && buf[BYTES - 1] == 0x32);
    nrt_tensor_free(&second);
    nrt_close();

    /* And a third time, after a close with nothing loaded in between. */
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    second = run_once(neff, size, 0x33);
    nrt_tensor_free(&second);
    nrt_close();
    free(neff);
    printf("REINIT OK\n");
    return 0;
}
