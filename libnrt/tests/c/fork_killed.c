/*
 * A pre-fork server's shape: nrt_init, then fork() without exec (the child keeps running),
 * then the parent is killed outright. The parent's datastore must read as stale while the
 * child lives: the child must not hold the file's lock on its dead parent's behalf.
 * Prints "CHILD <pid>" (the test kills the child), then SIGKILLs itself.
 * Usage: fork_killed
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include "nrt/nrt.h"
#include "common.h"

int main(void) {
    pid_t child;
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    fflush(stdout);
    child = fork();
    ASSERT(child >= 0);
    if (child == 0) {
        /* The child never touches the runtime; it outlives its parent. Its output goes to
         * /dev/null, so the test's pipes close when the parent dies. */
        int null = open("/dev/null", O_WRONLY);
        ASSERT(null >= 0);
        dup2(null, 1);
        dup2(null, 2);
        sleep(60);
        _exit(0);
    }
    printf("CHILD %d\n", (int)child);
    fflush(stdout);
    raise(SIGKILL);
    return 1;
}
