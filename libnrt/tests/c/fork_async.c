/*
 * The explicit async API in a child forked after the parent used it, and no library thread left
 * after nrt_close. Usage: fork_async MODEL (an identity model over 512 bytes)
 *
 * The parent initialises, runs one execution waited for on a sequence-id eventfd (which starts
 * the library's completion relay), then forks. The child calls nrt_init (its own runtime and
 * device), runs an execution and a tensor read waited for on eventfds only — sequence id and XU
 * completion — and checks each `ret` and the data, then closes and exits with one thread left.
 * The inherited relay (the parent's epoll set, whose thread is not in the child) must not be
 * used: the child's eventfds would never be signalled, and the parent's relay would be woken by
 * them. The parent then runs another execution the same way, closes, and is left with one
 * thread too.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nrt/nrt.h"
#include "nrt/nrt_async.h"
#include "common.h"
#include "proc_threads.h"

#define BYTES 512u
#define UNWRITTEN ((NRT_STATUS)0xDEAD)

static nrt_model_t *model;
static nrt_tensor_set_t *inputs, *outputs;
static nrt_tensor_t *in, *out;

static void setup(const char *path) {
    size_t size;
    void *neff = read_file(path, &size);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    CHECK(nrt_load(neff, size, 0, 1, &model));
    free(neff);
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "input", &in));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, BYTES, "output", &out));
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_allocate_tensor_set(&outputs));
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "input", in));
    CHECK(nrt_add_tensor_to_tensor_set(outputs, "output", out));
}

static void teardown(void) {
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    nrt_tensor_free(&in);
    nrt_tensor_free(&out);
    CHECK(nrt_unload(model));
    nrt_close();
}

/* The count of eventfd `fd` once it is readable, or 0 after 20 s. */
static uint64_t wait_eventfd(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    uint64_t count = 0;
    if (poll(&p, 1, 20000) != 1) {
        return 0;
    }
    ASSERT(read(fd, &count, sizeof count) == (ssize_t)sizeof count);
    return count;
}

/* One execution of `fill`-valued bytes, waited for on a sequence-id eventfd only. */
static void execute_on_eventfd(const char *who, unsigned char fill) {
    unsigned char want[BYTES], got[BYTES];
    NRT_STATUS ret = UNWRITTEN;
    nrta_seq_t seq = 0;
    int fd = eventfd(0, EFD_CLOEXEC);
    ASSERT(fd >= 0);
    memset(want, fill, sizeof want);
    CHECK(nrt_tensor_write(in, want, 0, sizeof want));
    CHECK(nrta_execute_schedule(model, inputs, outputs, 0, &ret, &seq));
    CHECK(nrta_event_register_seq_id_completion(seq, fd));
    if (wait_eventfd(fd) != 1) {
        fprintf(stderr, "%s: the sequence-id eventfd was not signalled\n", who);
        exit(1);
    }
    ASSERT(ret == NRT_SUCCESS);
    CHECK(nrt_tensor_read(out, got, 0, sizeof got));
    ASSERT(memcmp(want, got, sizeof got) == 0);
    close(fd);
}

static int child(const char *path) {
    unsigned char got[BYTES];
    NRT_STATUS ret = UNWRITTEN;
    nrta_seq_t seq = 0;
    int xu_fd = eventfd(0, EFD_CLOEXEC);
    ASSERT(xu_fd >= 0);
    /* The parent's runtime is not this process's: a call before nrt_init is refused. */
    EXPECT(nrta_execute_schedule(model, inputs, outputs, 0, &ret, &seq), NRT_UNINITIALIZED);
    ASSERT(ret == UNWRITTEN);
    setup(path);
    execute_on_eventfd("child", 0x5a);
    CHECK(nrta_event_register_xu_completion(0, NRTA_XU_TENSOR_OP, 0, xu_fd));
    memset(got, 0, sizeof got);
    CHECK(nrta_tensor_read(got, out, 0, sizeof got, 0, 0, &ret, &seq));
    if (wait_eventfd(xu_fd) != 1) {
        fprintf(stderr, "child: the XU completion eventfd was not signalled\n");
        return 1;
    }
    ASSERT(ret == NRT_SUCCESS && got[0] == 0x5a && got[BYTES - 1] == 0x5a);
    teardown();
    if (!alone()) {
        fprintf(stderr, "child: threads are left after nrt_close\n");
        return 1;
    }
    close(xu_fd);
    printf("CHILD OK\n");
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    pid_t pid;
    int status = 0;
    ASSERT(argc == 2);
    setup(argv[1]);
    execute_on_eventfd("parent", 0x11);
    fflush(stdout);
    pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        _exit(child(argv[1]));
    }
    ASSERT(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "the child failed (status %d)\n", status);
        return 1;
    }
    execute_on_eventfd("parent after the child", 0x22);
    teardown();
    if (!alone()) {
        fprintf(stderr, "parent: threads are left after nrt_close\n");
        return 1;
    }
    printf("FORK ASYNC OK\n");
    return 0;
}
